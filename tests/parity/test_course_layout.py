"""The course's own test harness against tests/adapters.py: the CS336 / CSE599-O test files sit in their `tests/`
package beside the student's adapters.py and import it relatively (`from .adapters import run_linear`), with the
package's conftest.py and a helper module beside them. Here a package laid out that way holds a copy of this
repository's tests/adapters.py and course-style tests (our own, each against torch or a hand-checked number), and
pytest runs it as the course's harness does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

from tests.train_helpers import ROOT

COURSE_FILES = {
    "__init__.py": "",
    "common.py": """
        FIXTURE_SEED = 4
    """,
    "conftest.py": """
        import pytest
        import torch

        from .common import FIXTURE_SEED


        @pytest.fixture
        def in_embeddings():
            torch.manual_seed(FIXTURE_SEED)
            return torch.randn(2, 5, 12)
    """,
    "test_model.py": """
        import torch
        import torch.nn.functional as F

        import torchref

        from .adapters import run_linear, run_rmsnorm, run_transformer_lm


        def test_linear(in_embeddings):
            w = torch.randn(7, 12)
            torch.testing.assert_close(run_linear(12, 7, w, in_embeddings), F.linear(in_embeddings, w))


        def test_rmsnorm(in_embeddings):
            g = torch.rand(12) + 0.5
            rms = in_embeddings.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
            torch.testing.assert_close(run_rmsnorm(12, 1e-5, g, in_embeddings), in_embeddings / rms * g)


        def test_transformer_lm_takes_the_spec_weight_names():
            torch.manual_seed(0)
            cfg = torchref.ModelConfig(vocab_size=31, context_length=8, d_model=12, num_layers=2, num_heads=3,
                                       d_ff=20, rope_theta=10000.0)
            model = torchref.TransformerLM(cfg)
            ids = torch.randint(0, 31, (2, 6))
            got = run_transformer_lm(31, 8, 12, 2, 3, 20, 10000.0, model.state_dict(), ids)
            torch.testing.assert_close(got, model(ids))
    """,
    "test_optimizer.py": """
        import torch

        from .adapters import get_adamw_cls, run_cross_entropy


        def test_cross_entropy():
            logits, targets = torch.randn(6, 11), torch.randint(0, 11, (6,))
            torch.testing.assert_close(run_cross_entropy(logits, targets),
                                       torch.nn.functional.cross_entropy(logits, targets))


        def test_adamw_matches_torch():
            torch.manual_seed(1)
            ours, theirs = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
            theirs.data.copy_(ours.data)
            a = get_adamw_cls()([ours], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
            b = torch.optim.AdamW([theirs], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
            for _ in range(3):
                for p, opt in ((ours, a), (theirs, b)):
                    opt.zero_grad()
                    (p ** 3).sum().backward()
                    opt.step()
            torch.testing.assert_close(ours.data, theirs.data)
    """,
    "test_tokenizer.py": """
        from .adapters import get_tokenizer


        def test_a_merge_and_a_special_token():
            vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"<|endoftext|>"}
            tok = get_tokenizer(vocab, [(b"a", b"b")], special_tokens=["<|endoftext|>"])
            assert tok.encode("abc<|endoftext|>") == [256, 99, 257]
            assert tok.decode([256, 99, 257]) == "abc<|endoftext|>"
    """,
}


def test_the_course_tests_run_against_tests_adapters_py(tmp_path):
    """Before, the adapters had moved to tests/parity/adapters.py and the course's `from .adapters import ...`
    failed at collection."""
    course = tmp_path / "tests"
    course.mkdir()
    shutil.copyfile(ROOT / "tests" / "adapters.py", course / "adapters.py")
    for name, text in COURSE_FILES.items():
        (course / name).write_text(textwrap.dedent(text).lstrip())
    # The course's harness: pytest in the assignment's folder, jaxlm and torchref installed (here: on the path).
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and "6 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
