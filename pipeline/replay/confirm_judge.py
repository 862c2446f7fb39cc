"""A model step's correction written by the judge, when no passing run of the scenario gives a gold reference.

The judge (any OpenAI-compatible endpoint: ``TRACEDAG_JUDGE_MODEL``, ``TRACEDAG_JUDGE_BASE_URL``,
``TRACEDAG_JUDGE_API_KEY``, as ``tracedag score`` uses it) gets the failed step's name, input, output and
error, and writes the output the step should have produced; temperature 0. The text is the step's
replacement in the check (``replacement_kind`` ``judge``, ``replacement_source`` ``judge:<model>``, the
text itself in ``replacement_output``). A judge that cannot be reached or answers with an error leaves
the check inconclusive with the reason; it never stops the other checks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tracedag.pipeline.score.judge.config import JudgeConfig

logger = logging.getLogger(__name__)

SYSTEM = (
    "You correct one failed step of an AI agent. You get the step's name, its input, the output it produced "
    "and its error. Write only the output the step should have produced for that input, as the step itself "
    "would write it: no explanation, no quotes, no preamble."
)
MAX_CHARS = 4000


@dataclass(frozen=True)
class FailedStep:
    """What the judge sees of the root step."""

    step_name: str
    input_text: str | None
    output_text: str | None
    error: str | None


class CorrectionFailed(Exception):
    """The judge gave no correction (unreachable, an error status, an empty answer)."""


def prompt(step: FailedStep) -> str:
    """The user message: the step's name, input, output and error (each cut to ``MAX_CHARS``)."""
    def cut(text: str | None) -> str:
        return (text or "(none)")[:MAX_CHARS]

    return (f"STEP: {step.step_name}\n\nINPUT:\n{cut(step.input_text)}\n\nOUTPUT:\n{cut(step.output_text)}"
            f"\n\nERROR:\n{cut(step.error)}\n\nThe corrected output:")


def correction(config: JudgeConfig, step: FailedStep) -> str:
    """The judge's corrected output of ``step``; raises ``CorrectionFailed`` with the reason."""
    try:
        import openai
    except ImportError as e:  # the optional dependency of the judge
        raise CorrectionFailed("the judge needs the openai client: pip install 'tracedag[judge]'") from e
    cfg = config.with_key()
    client = openai.OpenAI(base_url=cfg.base_url, api_key=cfg.api_key, timeout=cfg.timeout_s,
                           max_retries=cfg.max_retries)
    try:
        reply = client.chat.completions.create(
            model=cfg.model, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt(step)}])
    except openai.APIStatusError as e:
        raise CorrectionFailed(f"the judge {cfg.model} answered HTTP {e.status_code}") from e
    except openai.APIError as e:  # connection errors and timeouts, after the retries
        raise CorrectionFailed(f"the judge {cfg.model} could not be reached: {type(e).__name__}") from e
    text = (reply.choices[0].message.content or "").strip() if reply.choices else ""
    if not text:
        raise CorrectionFailed(f"the judge {cfg.model} answered with no text")
    return text
