"""tracedag.pipeline.replay: replay stored conversations against an agent (DESIGN §8, EDGE §4.1).

- ``source``: select stored conversations (ids, a condition over them, time, failed only) and read
  their user turns from the normalized spans (every dialect; one trace per turn or per conversation);
- ``targets``: the agents a replay drives (``module:function``, an OpenAI-compatible endpoint, a
  builtin such as ``example`` registered by the command layer);
- ``runner``: hold each conversation N times inside run labels, in parallel, over OTLP.
"""

from tracedag.pipeline.replay.runner import ReplayConfig, ReplayResult, RunRecord, replay
from tracedag.pipeline.replay.source import Selection, SourceConversation, parse_since, select_conversations
from tracedag.pipeline.replay.targets import Outcome, RunInfo, Target, TargetFactory, load_target, parse_opts

__all__ = [
    "Outcome",
    "ReplayConfig",
    "ReplayResult",
    "RunInfo",
    "RunRecord",
    "Selection",
    "SourceConversation",
    "Target",
    "TargetFactory",
    "load_target",
    "parse_opts",
    "parse_since",
    "replay",
    "select_conversations",
]
