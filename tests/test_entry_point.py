"""backend="fxopt" works without importing fxopt: torch finds it through the entry point."""

import subprocess
import sys
import textwrap


def test_string_backend_is_discovered_without_importing_fxopt():
    script = textwrap.dedent("""
        import sys
        import torch
        assert "fxopt" not in sys.modules
        model = torch.nn.Linear(5, 3)
        compiled = torch.compile(model, backend="fxopt", options={"strict": True,
                                                                "codegen": "fx"})
        x = torch.randn(4, 5)
        out = compiled(x)
        out.sum().backward()
        torch.testing.assert_close(out, model(x))
        assert model.weight.grad is not None
        from torch._dynamo.backends.registry import list_backends
        print("fxopt" in list_backends(exclude_tags=()), "fxopt" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # fxopt got imported only by torch's lookup of the entry point, after compile was asked
    assert result.stdout.split() == ["True", "True"]
