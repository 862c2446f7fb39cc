"""``tracedag.testing``: per-step tests on captured cases (``tracedag capture``), and a pytest plugin.

    from tracedag.testing import load_case, run_step
    case = load_case("cases/propose_slot.json")          # the state before one step of a trace
    result = run_step(my_agent.propose_slot, case)       # calls my_agent.propose_slot(case)
    assert result.ok and "court" in result.output

The pytest plugin (``tracedag.testing.plugin``, registered as a ``pytest11`` entry point) adds the
``invariant(repeats=N)`` and ``capability(reruns=N)`` markers, the ``tracedag_case`` and ``judge``
fixtures, and exports eval results as ``gen_ai.evaluation.result`` events (``--tracedag-endpoint``).
It imports only the standard library, pytest and (when exporting) ``tracedag.instrument``.
"""

from tracedag.testing.case import Case, CaseError, CaseStep, load_case
from tracedag.testing.judge import Judge, JudgeError, JudgeResult
from tracedag.testing.run import StepResult, record_evaluation, run_step, step_span

__all__ = ["Case", "CaseError", "CaseStep", "Judge", "JudgeError", "JudgeResult", "StepResult", "load_case",
           "record_evaluation", "run_step", "step_span"]
