"""Option parsing and validation: every bad input gets a clear error."""

import pytest

import fxopt
from fxopt import config
from fxopt.config import MemoryBudget


@pytest.mark.parametrize("value, expected", [
    (6 * 2**30, MemoryBudget(bytes=6 * 2**30)),
    ("6GiB", MemoryBudget(bytes=6 * 2**30)),
    ("6 GiB", MemoryBudget(bytes=6 * 2**30)),
    ("512MB", MemoryBudget(bytes=512 * 10**6)),
    ("1.5gib", MemoryBudget(bytes=int(1.5 * 2**30))),
    ("4096", MemoryBudget(bytes=4096)),
    (0.5, MemoryBudget(fraction=0.5)),
    (1.0, MemoryBudget(fraction=1.0)),
    ("50%", MemoryBudget(fraction=0.5)),
    ("0.25", MemoryBudget(fraction=0.25)),
])
def test_memory_budget_forms(value, expected):
    assert config.resolve({"memory_budget": value}).memory_budget == expected


@pytest.mark.parametrize("value, error, words", [
    ("6 gigs", ValueError, "cannot read memory_budget '6 gigs'"),
    (-1, ValueError, "must be positive"),
    (0, ValueError, "must be positive"),
    (0.0, ValueError, "fraction of activation memory in (0, 1]"),
    (1.5, ValueError, "fraction of activation memory in (0, 1]"),
    (True, TypeError, "must not be a bool"),
    ([6], TypeError, "has type list"),
    ("150%", ValueError, "in (0, 1]"),
])
def test_bad_memory_budget(value, error, words):
    with pytest.raises(error) as info:
        config.resolve({"memory_budget": value})
    assert words in str(info.value)


def test_unknown_option_names_key_and_lists_valid_ones():
    with pytest.raises(ValueError) as info:
        config.resolve({"tempoo": True})
    message = str(info.value)
    assert "'tempoo'" in message and "Did you mean 'tempo'" in message
    for name in ("tempo", "fuse_elementwise", "memory_budget", "codegen", "debug_dir"):
        assert name in message


@pytest.mark.parametrize("options, error, words", [
    ({"tempo": "yes please"}, TypeError, "'tempo' must be True, False, None or 'auto'"),
    ({"strict": None}, TypeError, "'strict' must be True or False"),
    ({"codegen": "c++"}, ValueError, "'codegen' must be one of ('auto', 'fx', 'inductor')"),
    ({"debug_dir": 3}, TypeError, "'debug_dir' must be a path"),
    ({"rewrite_limit": {"tempo": -1}}, TypeError, "rewrite_limit"),
    ({"rewrite_limit": "tempo"}, ValueError, "pass=N"),
])
def test_wrong_types_and_values(options, error, words):
    with pytest.raises(error) as info:
        config.resolve(options)
    assert words in str(info.value)


def test_options_must_be_a_mapping():
    with pytest.raises(TypeError, match="options must be a dict"):
        config.resolve(["tempo"])


def test_defaults_and_planner_follows_budget():
    options = config.resolve()
    assert options.codegen == "auto" and options.strict is False and options.tempo is None
    assert options.planner_enabled is False
    assert config.resolve({"memory_budget": "1GiB"}).planner_enabled is True
    assert config.resolve({"memory_budget": "1GiB", "planner": False}).planner_enabled is False


def test_patch_as_context_manager_and_decorator():
    with config.patch(strict=True, memory_budget=0.5):
        assert config.resolve().strict is True
        with config.patch(strict=False):
            assert config.resolve().strict is False
        assert config.resolve().strict is True
        assert config.resolve({"strict": False}).strict is False  # options win over patches
    assert config.resolve().strict is False

    @config.patch(codegen="inductor")
    def compiled_codegen():
        return config.resolve().codegen

    assert compiled_codegen() == "inductor"
    assert config.resolve().codegen == "auto"


def test_patch_validates_eagerly():
    with pytest.raises(ValueError, match="unknown option 'stritc'"):
        config.patch(stritc=True)


def test_environment_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("FXOPT_STRICT", "1")
    monkeypatch.setenv("FXOPT_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("FXOPT_MEMORY_BUDGET", "2GiB")
    monkeypatch.setenv("FXOPT_TEMPO", "off")
    options = config.resolve()
    assert options.strict is True and options.debug_dir == str(tmp_path)
    assert options.memory_budget == MemoryBudget(bytes=2 * 2**30) and options.tempo is False
    with config.patch(strict=False):
        assert config.resolve().strict is False  # patches win over the environment
    monkeypatch.setenv("FXOPT_STRICT", "maybe")
    with pytest.raises(TypeError, match="'strict'"):
        config.resolve()


def test_modes():
    assert config.resolve(mode="default") == config.resolve()
    tuned = config.resolve(mode="max-autotune")
    assert tuned.codegen == "inductor" and tuned.inductor_max_autotune is True
    with pytest.raises(ValueError, match="unsupported mode 'reduce-overhead'"):
        config.resolve(mode="reduce-overhead")


def test_backend_object_validates_at_once():
    with pytest.raises(ValueError, match="unknown option 'fuse_everything'"):
        fxopt.backend(fuse_everything=True)
    with pytest.raises(ValueError, match="must be positive"):
        fxopt.backend(memory_budget=0)


def test_option_docs_cover_every_option():
    docs = config.option_docs()
    assert set(docs) == set(config.Options.__dataclass_fields__)
    assert all(docs.values())
