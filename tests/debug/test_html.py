"""`fxopt diff DIR --html`: one self-contained page. Parsed with html.parser: every node of
both graphs is there, the highlighted rows are exactly the true diff, links between
replaced and replacing nodes resolve; a tiny GPT-2's graphs render; and, when Chromium is
installed, the page renders in a real browser with its script running."""

import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser

import pytest
import torch
from conftest import compile_and_step
from debug_passes import SPLIT_ADDMM, true_diff

from fxopt.__main__ import main

CHROMIUM = "/usr/bin/chromium"


class Page(HTMLParser):
    """Rows per (section id, side), every id, link target and external reference."""

    def __init__(self, text):
        super().__init__()
        self.sections, self.ids, self.links, self.external = {}, set(), [], []
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
            self.sections[self._section][self._side][attrs["data-n"]] = attrs["class"]


def write_page(root, out, *extra):
    assert main(["diff", str(root), "--html", str(out), *extra]) == 0
    return out.read_text()


def test_page_holds_both_graphs_and_highlights_exactly_the_diff(mlp_dump, tmp_path, capsys):
    page = Page(write_page(mlp_dump.root, tmp_path / "diff.html"))
    ((record, before, after),) = mlp_dump.recorder.changes
    added, removed, changed = true_diff(before, after)
    (section,) = page.sections.values()
    assert section["pass"] == "split_addmm" and section["graph"] == record.graph
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
        assert section["graph"] == record.graph
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
