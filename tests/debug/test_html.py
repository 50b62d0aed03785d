"""`fxopt diff DIR --html`: one self-contained page. Parsed with html.parser: every node of
both graphs is there, the highlighted rows are exactly the true diff, links between
replaced and replacing nodes resolve; a tiny GPT-2's graphs render; and, when Chromium is
installed, the page renders in a real browser with its script running."""

import json
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser

import pytest
import torch
from conftest import compile_and_step
from debug_passes import SPLIT_ADDMM, true_diff

from fxopt.__main__ import main
from fxopt.debug.snapshot import target_name
from fxopt.units import format_bytes

CHROMIUM = "/usr/bin/chromium"


class Page(HTMLParser):
    """Rows per (section id, side), every id, link target and external reference."""

    def __init__(self, text):
        super().__init__()
        self.sections, self.ids, self.links, self.external = {}, set(), [], []
        self.rows = []  # (name, target) of every node row
        self.tags, self.text = Counter(), text
        self._section, self._side = None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] += 1
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            if (key == "src" and key in attrs) or value.startswith(("http:", "https:", "//")):
                self.external.append((tag, key, value))
        if tag == "link":
            self.external.append((tag, "link", attrs.get("href")))
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag == "section":
            self._section = attrs["id"]
            self.sections[self._section] = {"pass": attrs["data-pass"],
                                            "graph": attrs["data-graph"]}
        if tag == "div" and "data-side" in attrs:
            self._side = attrs["data-side"]
            self.sections[self._section][self._side] = {}
        if tag == "tr" and "data-n" in attrs:
            self.rows.append((attrs["data-n"], attrs["data-t"]))
            self.sections[self._section][self._side][attrs["data-n"]] = attrs["class"]


def write_page(root, out, *extra):
    assert main(["diff", str(root), "--html", str(out), *extra]) == 0
    return out.read_text()


def test_page_holds_both_graphs_and_highlights_exactly_the_diff(mlp_dump, tmp_path, capsys):
    page = Page(write_page(mlp_dump.root, tmp_path / "diff.html"))
    ((record, before, after),) = mlp_dump.recorder.changes
    added, removed, changed = true_diff(before, after)
    (section,) = page.sections.values()
    assert section["pass"] == "split_addmm"
    assert section["graph"] == mlp_dump.dumped(record.graph)
    assert list(section["b"]) == [n.name for n in before.graph.nodes]
    assert list(section["a"]) == [n.name for n in after.graph.nodes]

    def having(side, cls):
        return {name for name, c in section[side].items() if c == cls}

    assert having("b", "rm") == removed and having("a", "add") == added
    assert having("b", "chg") == having("a", "chg") == changed
    assert set(section["b"]) - removed - changed == having("b", "same")
    internal = [link for link in page.links if link.startswith("#")]
    assert internal and all(link[1:] in page.ids for link in internal)
    assert {f"#s0-a-{n}" for n in added} <= set(internal)  # each replacement is linked
    assert page.external == []
    assert page.tags["svg"] == 1 and page.tags["polyline"] == 2  # memory before, after
    # the chart has axes: a byte scale from 0 to the top and the executed nodes
    top = max(v for s in (record.memory_before, record.memory_after) for _, v in s.timeline)
    assert page.tags["line"] >= 2 and "executed node (forward, then backward)" in page.text
    assert f">{format_bytes(top)}</text>" in page.text and ">0 B</text>" in page.text
    assert "<h4>before: " in page.text and "<h4>after: " in page.text
    # a search box, and every row carries what it searches (name and op)
    assert 'id="search"' in page.text
    targets = {n.name: target_name(n) for n in after.graph.nodes}
    assert all(t == targets[n] for n, t in page.rows[len(before.graph.nodes):])


def test_page_comparing_two_dumps_has_a_section_per_graph_kind(mlp_dump, plain_dump, tmp_path):
    out = tmp_path / "two.html"
    assert main(["diff", str(plain_dump.root), str(mlp_dump.root), "--html", str(out)]) == 0
    page = Page(out.read_text())
    ((_, before, after),) = mlp_dump.recorder.changes
    added, removed, changed = true_diff(before, after)
    kinds = {s["graph"].split("/")[1]: s for s in page.sections.values()}
    assert list(kinds) == ["dynamo", "joint", "forward", "backward"]
    forward = kinds["forward"]
    assert {n for n, c in forward["a"].items() if c == "add"} == added
    assert {n for n, c in forward["b"].items() if c == "rm"} == removed
    assert set(kinds["backward"]["b"].values()) == {"same"}
    # two dumps are A and B, not before and after
    assert f"A: {plain_dump.root}<br>B: {mlp_dump.root}" in page.text
    assert "<h4>A: " in page.text and "<h4>B: " in page.text
    assert "<h4>before" not in page.text and "before (grey)" not in page.text
    assert "A (grey)" in page.text


def test_page_for_a_dump_no_pass_changed(plain_dump, tmp_path):
    page = Page(write_page(plain_dump.root, tmp_path / "none.html"))
    assert page.sections == {} and "no pass changed a graph" in page.text


@pytest.fixture(scope="module")
def gpt2_page(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=4, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager", use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    root = tmp_path_factory.mktemp("gpt2")
    ids = torch.randint(0, 97, (2, 7))
    dumped = compile_and_step(lambda: model(input_ids=ids, labels=ids).loss, (), root,
                              (SPLIT_ADDMM,))
    out = root / "diff.html"
    assert main(["diff", str(root), "--html", str(out)]) == 0
    return dumped, out


@pytest.mark.slow
def test_gpt2_page_has_every_node_of_each_changed_graph(gpt2_page):
    dumped, out = gpt2_page
    page = Page(out.read_text())
    assert len(page.sections) == len(dumped.recorder.changes) >= 1
    for section, (record, before, after) in zip(page.sections.values(),
                                                dumped.recorder.changes):
        assert section["graph"] == dumped.dumped(record.graph)
        assert list(section["b"]) == [n.name for n in before.graph.nodes]
        assert list(section["a"]) == [n.name for n in after.graph.nodes]
        added, removed, _ = true_diff(before, after)
        assert {n for n, c in section["a"].items() if c == "add"} == added
        assert {n for n, c in section["b"].items() if c == "rm"} == removed


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                    reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_page_renders_in_headless_chromium(gpt2_page, tmp_path):
    dumped, out = gpt2_page
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--no-first-run", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         out.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert '<body class="js only">' in dom  # the inline script ran
    assert '<section class="step shown" id="s0"' in dom
    record, before, after = dumped.recorder.changes[0]
    added, removed, _ = true_diff(before, after)
    for name in sorted(added)[:5]:
        assert f'id="s0-a-{name}" class="add"' in dom
    for name in sorted(removed)[:5]:
        assert f'id="s0-b-{name}" class="rm"' in dom


PROBE = """<!DOCTYPE html><html><body>
<iframe id="page" src="%s" style="width:1400px;height:900px;border:0"></iframe>
<pre id="out">not loaded</pre><script>
document.getElementById('page').addEventListener('load', function () {
  var d = this.contentDocument, w = this.contentWindow, out = {};
  var side = d.querySelector('.step.shown .side');
  out.relatedRight = side.querySelector('th:last-child').getBoundingClientRect().right;
  out.sideRight = side.getBoundingClientRect().right;
  out.horizontalOverflow = side.scrollWidth - side.clientWidth;
  var search = d.getElementById('search');
  search.value = '%s';
  search.dispatchEvent(new w.Event('input'));
  out.shownRows = Array.prototype.filter.call(d.querySelectorAll('tr[data-n]'),
      function (r) { return w.getComputedStyle(r).display !== 'none'; }).length;
  out.hits = d.getElementById('hits').textContent;
  search.dispatchEvent(new w.KeyboardEvent('keydown', {key: 'Enter'}));
  out.shownStepHasHit = !!d.querySelector('.step.shown tr.hit');
  document.getElementById('out').textContent = JSON.stringify(out);
});
</script></body></html>"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                    reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_page_at_1400_px_shows_the_related_column_and_searches(gpt2_page, tmp_path):
    dumped, out = gpt2_page
    page = Page(out.read_text())
    _, before, after = dumped.recorder.changes[0]
    query = min(true_diff(before, after)[0])[:4].upper()  # the search ignores case
    expected = sum(1 for name, target in page.rows
                   if query.lower() in name.lower() or query.lower() in target.lower())
    probe = tmp_path / "probe.html"
    probe.write_text(PROBE % (out.as_uri(), query))
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--no-first-run", "--disable-component-update",
         "--disable-sync", "--allow-file-access-from-files", "--virtual-time-budget=20000",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(Page(result.stdout).text.split('<pre id="out">')[1].split("</pre>")[0])
    assert measured["horizontalOverflow"] <= 0, measured
    assert measured["relatedRight"] <= measured["sideRight"], measured
    assert expected > 0 and measured["shownRows"] == expected, (query, measured)
    assert measured["hits"] == f"{expected} matching rows"
    assert measured["shownStepHasHit"], measured
