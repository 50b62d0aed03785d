"""``fxopt diff DIR --html out.html``: one self-contained page, standard library only.

Left, a search box (node names and ops: only matching rows show, passes without a match are
greyed, Enter steps through the matches), the graphs and their passes; right, for the chosen
pass, its summary, the memory timeline before and after as an inline SVG chart with axes
(live bytes over executed nodes), and the graph before and after side by side (two dumps
compared are labelled A and B). The columns wrap rather than push the "related" column out
of view on a narrow window. Rows are highlighted as removed (``rm``), added (``add``) or
changed (``chg``) and unchanged rows are ``same``; a removed node links to the nodes that
replace it and back, a changed node to its other side. Hovering a row shows its shape,
dtype, predicted bytes, live bytes and the pass that created it; clicking shows the same in
the detail pane.

Every node of both graphs is in the markup (so the page works, less conveniently, with
scripts off, and tests can parse it); the small inline script only shows one pass at a
time and hides unchanged rows on request, which keeps a GPT-2 backward graph of a few
thousand nodes per side quick to browse. No network, no external scripts or fonts.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from fxopt.debug.diff import Step
from fxopt.debug.text import shape_text, summary_line, verdicts_line
from fxopt.units import format_bytes

__all__ = ["write_html", "render_html"]

_CHART_POINTS = 400  # a timeline longer than this is drawn as per-bucket maxima

_CSS = """
body{margin:0;font:13px/1.35 system-ui,sans-serif;display:flex;height:100vh}
nav{width:260px;overflow:auto;border-right:1px solid #ccc;padding:8px;flex:none}
nav a{display:block;padding:2px 4px;color:#124;text-decoration:none}
nav a.cur{background:#dde6f5}
nav h3{margin:10px 0 2px;font-size:13px}
main{flex:1;overflow:auto;padding:8px 12px}
.js .step{display:none}.js .step.shown{display:block}
.sides{display:flex;gap:10px}.side{flex:1;min-width:0;max-height:70vh;overflow:auto}
table{border-collapse:collapse;font:12px/1.3 ui-monospace,monospace;width:100%;
table-layout:fixed}
td,th{padding:1px 5px;text-align:left;overflow-wrap:anywhere;vertical-align:top}
th:nth-child(1){width:22%}th:nth-child(2){width:30%}th:nth-child(3){width:18%}
th:nth-child(4){width:10%}th:nth-child(5){width:20%}
#search{width:100%;box-sizing:border-box;margin:6px 0 2px}
nav a.miss{color:#aaa}
tr.rm{background:#fdd}tr.add{background:#dfd}tr.chg{background:#ffedb3}
tr.flash{outline:2px solid #c60}
.only tr.same{display:none}
.searching tr[data-n]{display:none}.searching tr.hit{display:table-row}
#detail{position:fixed;right:8px;bottom:8px;max-width:45%;background:#fff;
border:1px solid #999;padding:6px;white-space:pre-wrap;font:12px ui-monospace,monospace}
svg{background:#fafafa;border:1px solid #ddd}
svg text{font:10px system-ui,sans-serif;fill:#444}svg line{stroke:#888}
"""

_JS = """
document.body.classList.add('js');
function show(id){
  var el=document.getElementById(id); if(!el) return;
  var step=el.closest('.step'); if(!step) return;
  document.querySelectorAll('.step.shown').forEach(function(s){s.classList.remove('shown')});
  step.classList.add('shown');
  document.querySelectorAll('nav a').forEach(function(a){
    a.classList.toggle('cur', a.getAttribute('href')==='#'+step.id)});
  if(el!==step){
    if(el.classList.contains('same')){
      document.getElementById('only').checked=false;
      document.body.classList.remove('only');}
    el.scrollIntoView({block:'center'}); el.classList.add('flash');
    setTimeout(function(){el.classList.remove('flash')},1500);}
}
document.getElementById('only').addEventListener('change',function(e){
  document.body.classList.toggle('only',e.target.checked)});
document.body.classList.add('only');
window.addEventListener('hashchange',function(){show(location.hash.slice(1))});
document.addEventListener('click',function(e){
  var row=e.target.closest('tr[data-n]');
  if(row) document.getElementById('detail').textContent=row.title;});
var search=document.getElementById('search'), hits=[], hitAt=-1;
search.addEventListener('input',function(){
  var q=search.value.trim().toLowerCase();
  document.body.classList.toggle('searching',q!=='');
  hits=[]; hitAt=-1;
  document.querySelectorAll('tr[data-n]').forEach(function(r){
    var hit=q!==''&&(r.dataset.n.toLowerCase().indexOf(q)>=0||
                     r.dataset.t.toLowerCase().indexOf(q)>=0);
    r.classList.toggle('hit',hit); if(hit) hits.push(r);});
  document.querySelectorAll('nav a[href^="#s"]').forEach(function(a){
    var s=document.getElementById(a.getAttribute('href').slice(1));
    a.classList.toggle('miss',q!==''&&!s.querySelector('tr.hit'));});
  document.getElementById('hits').textContent=q?hits.length+' matching rows':'';});
search.addEventListener('keydown',function(e){
  if(e.key!=='Enter'||!hits.length) return;
  hitAt=(hitAt+1)%hits.length; show(hits[hitAt].id);});
var first=document.querySelector('.step');
show(location.hash.slice(1)||(first&&first.id));
"""


def _node_title(node: dict[str, Any]) -> str:
    made_by = (node.get("fxopt") or {}).get("pass")
    replaces = (node.get("fxopt") or {}).get("replaces")
    lines = [f"{node['name']} = {node['target']}({node['inputs']})",
             f"op: {node['op']}",
             f"shape/dtype: {shape_text(node) or '-'}",
             f"predicted bytes: {format_bytes(node.get('bytes'))}",
             f"live bytes while it runs: {format_bytes(node.get('live'))}",
             f"created by pass: {made_by or '- (captured)'}"]
    if replaces:
        lines.append(f"replaces: {', '.join(replaces)}")
    return "\n".join(lines)


def _links(step_id: str, side: str, names: list[str], label: str) -> str:
    anchors = ", ".join(f'<a href="#{step_id}-{side}-{escape(n)}">{escape(n)}</a>'
                        for n in names)
    return f"{label} {anchors}" if names else ""


def _rows(step_id: str, side: str, nodes: list[dict[str, Any]], status: dict[str, str],
          related: dict[str, str]) -> list[str]:
    rows = []
    for node in nodes:
        name = node["name"]
        rows.append(
            f'<tr id="{step_id}-{side}-{escape(name)}" class="{status.get(name, "same")}" '
            f'data-n="{escape(name)}" data-t="{escape(node["target"])}" '
            f'title="{escape(_node_title(node))}">'
            f"<td>{escape(name)}</td><td>{escape(node['target'])}</td>"
            f"<td>{escape(shape_text(node))}</td><td>{format_bytes(node.get('bytes'))}</td>"
            f"<td>{related.get(name, '')}</td></tr>")
    return rows


def _labels(step: Step) -> tuple[str, str]:
    """Two dumps compared are A and B (as ``fxopt diff A B`` names them); a pass's input
    and output are before and after."""
    return ("A", "B") if step.name == "A vs B" else ("before", "after")


def _chart(step: Step) -> str:
    """Live bytes per executed node, before (grey) and after (blue), on one scale, with a
    byte axis (0, half, top) and a node axis (first and last executed node)."""
    series = [((s.memory or {}).get("timeline") or []) for s in (step.before, step.after)]
    top = max((v for line in series for _, v in line), default=0)
    if not top:
        return "<p>no memory prediction for this graph</p>"
    left, bottom, width, height = 64, 28, 600, 120  # plot area and margins, in pixels
    lines = []
    for colour, timeline in zip(("#999", "#1f5fbf"), series):
        values = [v for _, v in timeline]
        bucket = max(1, -(-len(values) // _CHART_POINTS))
        peaks = [max(values[i:i + bucket]) for i in range(0, len(values), bucket)]
        step_x = width / max(1, len(peaks) - 1)
        points = " ".join(f"{left + i * step_x:.1f},{height - v / top * (height - 10):.1f}"
                          for i, v in enumerate(peaks))
        lines.append(f'<polyline fill="none" stroke="{colour}" points="{points}"/>')
    axes = [f'<line x1="{left}" y1="0" x2="{left}" y2="{height}"/>',
            f'<line x1="{left}" y1="{height}" x2="{left + width}" y2="{height}"/>']
    for fraction in (0, 0.5, 1):
        y = height - fraction * (height - 10)
        axes.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}"/>'
                    f'<text x="{left - 6}" y="{y + 3:.1f}" text-anchor="end">'
                    f"{format_bytes(int(top * fraction))}</text>")
    steps = max(len(line) for line in series)
    axes.append(f'<text x="{left}" y="{height + 12}">1</text>'
                f'<text x="{left + width}" y="{height + 12}" text-anchor="end">{steps}</text>'
                f'<text x="{left + width / 2}" y="{height + 24}" text-anchor="middle">'
                "executed node (forward, then backward)</text>")
    first, second = _labels(step)
    return (f'<svg class="chart" width="{left + width + 8}" height="{height + bottom}" '
            f'role="img"><title>predicted live bytes per node: {first} (grey) and '
            f"{second} (blue); top {format_bytes(top)}</title>{''.join(axes)}"
            f"{''.join(lines)}</svg>"
            f"<div>predicted live bytes per executed node: {first} (grey) "
            f"{format_bytes((step.before.memory or {}).get('peak_bytes'))} peak, {second} "
            f"(blue) {format_bytes((step.after.memory or {}).get('peak_bytes'))} peak</div>")


def _section(index: int, step: Step) -> str:
    step_id = f"s{index}"
    diff = step.diff
    before_status = {n["name"]: "rm" for n in diff.removed}
    after_status = {n["name"]: "add" for n in diff.added}
    for old, new in diff.changed:
        before_status[old["name"]] = after_status[new["name"]] = "chg"
    before_links = {old: _links(step_id, "a", new, "replaced by")
                    for old, new in diff.replaced_by.items()}
    after_links = {new: _links(step_id, "b", old, "replaces")
                   for new, old in diff.replaces.items()}
    for old, new in diff.changed:
        before_links[old["name"]] = _links(step_id, "a", [new["name"]], "after:")
        after_links[new["name"]] = _links(step_id, "b", [old["name"]], "before:")
    sides = []
    first, second = _labels(step)
    for side, label, snapshot, status, links in (
            ("b", first, step.before, before_status, before_links),
            ("a", second, step.after, after_status, after_links)):
        rows = _rows(step_id, side, snapshot.nodes, status, links)
        sides.append(f'<div class="side" data-side="{side}"><h4>{label}: '
                     f"{escape(snapshot.label)} ({len(snapshot.nodes)} nodes)</h4>"
                     f"<table><tr><th>node</th><th>target</th><th>shape</th><th>bytes</th>"
                     f"<th>related</th></tr>{''.join(rows)}</table></div>")
    return (f'<section class="step" id="{step_id}" data-graph="{escape(step.title)}" '
            f'data-pass="{escape(step.name)}"><h2>{escape(step.title)}: '
            f"{escape(step.name)}</h2><p>{escape(summary_line(step))}</p>"
            f"<p>{escape(verdicts_line(step) or '')}</p>{_chart(step)}"
            f'<div class="sides">{"".join(sides)}</div></section>')


def render_html(steps: list[Step], dumps: list[str]) -> str:
    """The page as a string (see the module docstring) for the one dump, or the two
    compared, that ``dumps`` names."""
    title = " vs ".join(dumps)
    names = escape(dumps[0]) if len(dumps) == 1 else "<br>".join(
        f"{label}: {escape(d)}" for label, d in zip("AB", dumps))
    nav, heading = [], None
    for index, step in enumerate(steps):
        if step.title != heading:
            heading = step.title
            nav.append(f"<h3>{escape(step.title)}</h3>")
        nav.append(f'<a href="#s{index}">{escape(step.name)} '
                   f"(+{len(step.diff.added)} -{len(step.diff.removed)})</a>")
    if not steps:
        nav.append("<p>no pass changed a graph</p>")
    sections = "".join(_section(i, s) for i, s in enumerate(steps))
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>fxopt diff: {escape(title)}</title><style>{_CSS}</style></head>"
            f"<body><nav><strong>fxopt diff</strong><br>{names}"
            f'<input type="search" id="search" placeholder="search node names and ops">'
            f'<div id="hits"></div>'
            f'<label><input type="checkbox" id="only" checked> only changed nodes</label>'
            f"{''.join(nav)}</nav><main>{sections}</main>"
            f'<div id="detail">click a node for its details</div>'
            f"<script>{_JS}</script></body></html>")


def write_html(steps: list[Step], out: Path, dumps: list[str]) -> None:
    """Write the page to ``out``."""
    out.write_text(render_html(steps, dumps), encoding="utf-8")
