"""Correct code in the style of well-known public projects keeps its points (issue 19's fairness), in minimal
forms written for these tests.
"""

import textwrap

from tests.conftest import ROOT, explain

ROPE = (ROOT / "solutions" / "rope.py").read_text()


def test_a_rotary_table_built_with_autocast_off_keeps_its_device_points(grade_source):
    """Hugging Face's rotary embedding computes its table in float32 under torch.autocast(enabled=False): the meta
    device, the grader's stand-in for a GPU, cannot enter autocast ("unsupported scalarType"); a GPU can."""
    code = """
    def rope_cos_sin(positions, head_dim, base=10000.0):
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(
            device=positions.device, dtype=torch.float) / head_dim))
        with torch.autocast(device_type=positions.device.type, enabled=False):
            freqs = positions.float()[..., None] * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos(), emb.sin()
    """
    result = grade_source(textwrap.dedent(code), base=ROPE, name="rope.py", device="auto")
    step = next(s for s in result.steps if s.id == "rope_cos_sin")
    assert step.score == step.max_score, explain(result)
