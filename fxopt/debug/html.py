"""``fxopt diff DIR --html out.html``: one self-contained page, standard library only.

Left, the graphs and their passes; right, for the chosen pass, its summary, the memory
timeline before and after as an inline SVG chart, and the graph before and after side by
side. Rows are highlighted as removed (``rm``), added (``add``) or changed (``chg``) and
unchanged rows are ``same``; a removed node links to the nodes that replace it and back,
a changed node to its other side. Hovering a row shows its shape, dtype, predicted bytes,
live bytes and the pass that created it; clicking shows the same in the detail pane.

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
from fxopt.debug.text import shape_text, summary_line
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
table{border-collapse:collapse;font:12px/1.3 ui-monospace,monospace;width:100%}
td,th{padding:1px 5px;white-space:nowrap;text-align:left}
tr.rm{background:#fdd}tr.add{background:#dfd}tr.chg{background:#ffedb3}
tr.flash{outline:2px solid #c60}
.only tr.same{display:none}
#detail{position:fixed;right:8px;bottom:8px;max-width:45%;background:#fff;
border:1px solid #999;padding:6px;white-space:pre-wrap;font:12px ui-monospace,monospace}
svg{background:#fafafa;border:1px solid #ddd}
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
            f'data-n="{escape(name)}" title="{escape(_node_title(node))}">'
            f"<td>{escape(name)}</td><td>{escape(node['target'])}</td>"
            f"<td>{escape(shape_text(node))}</td><td>{format_bytes(node.get('bytes'))}</td>"
            f"<td>{related.get(name, '')}</td></tr>")
    return rows


def _chart(step: Step) -> str:
    """Live bytes per executed node, before (grey) and after (blue), on one scale."""
    series = [((s.memory or {}).get("timeline") or []) for s in (step.before, step.after)]
    top = max((v for line in series for _, v in line), default=0)
    if not top:
        return "<p>no memory prediction for this graph</p>"
    width, height = 600, 120
    lines = []
    for colour, timeline in zip(("#999", "#1f5fbf"), series):
        values = [v for _, v in timeline]
        bucket = max(1, -(-len(values) // _CHART_POINTS))
        peaks = [max(values[i:i + bucket]) for i in range(0, len(values), bucket)]
        step_x = width / max(1, len(peaks) - 1)
        points = " ".join(f"{i * step_x:.1f},{height - v / top * (height - 10):.1f}"
                          for i, v in enumerate(peaks))
        lines.append(f'<polyline fill="none" stroke="{colour}" points="{points}"/>')
    return (f'<svg class="chart" width="{width}" height="{height}" role="img">'
            f"<title>predicted live bytes per node: before (grey) and after (blue); "
            f"top {format_bytes(top)}</title>{''.join(lines)}</svg>"
            f"<div>live bytes per executed node, fw then bw: before (grey) "
            f"{format_bytes((step.before.memory or {}).get('peak_bytes'))} peak, after "
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
    for side, label, snapshot, status, links in (
            ("b", "before", step.before, before_status, before_links),
            ("a", "after", step.after, after_status, after_links)):
        rows = _rows(step_id, side, snapshot.nodes, status, links)
        sides.append(f'<div class="side" data-side="{side}"><h4>{label}: '
                     f"{escape(snapshot.label)} ({len(snapshot.nodes)} nodes)</h4>"
                     f"<table><tr><th>node</th><th>target</th><th>shape</th><th>bytes</th>"
                     f"<th>related</th></tr>{''.join(rows)}</table></div>")
    return (f'<section class="step" id="{step_id}" data-graph="{escape(step.title)}" '
            f'data-pass="{escape(step.name)}"><h2>{escape(step.title)}: '
            f"{escape(step.name)}</h2><p>{escape(summary_line(step))}</p>{_chart(step)}"
            f'<div class="sides">{"".join(sides)}</div></section>')


def render_html(steps: list[Step], title: str) -> str:
    """The page as a string (see the module docstring)."""
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
            f"<body><nav><strong>fxopt diff</strong><br>{escape(title)}"
            f'<br><label><input type="checkbox" id="only" checked> only changed nodes</label>'
            f"{''.join(nav)}</nav><main>{sections}</main>"
            f'<div id="detail">click a node for its details</div>'
            f"<script>{_JS}</script></body></html>")


def write_html(steps: list[Step], out: Path, title: str) -> None:
    """Write the page to ``out``."""
    out.write_text(render_html(steps, title), encoding="utf-8")
