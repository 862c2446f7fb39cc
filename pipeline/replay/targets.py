"""Agent targets a replay drives: a Python callable, an OpenAI-compatible endpoint, or a named builtin.

- ``module:function`` — called once per user turn with the conversation so far (a list of
  ``{"role", "content"}`` messages ending with the user's turn) and returning the reply text; plain
  or ``async``. It traces itself (``tracedag.instrument`` or any OpenTelemetry instrumentation).
- ``http://…`` / ``https://…`` — an OpenAI-compatible chat-completions base URL; each turn sends the
  history with the official ``openai`` client and is traced by tracedag as one ``invoke_agent`` step
  (input messages, reply, ``gen_ai.user.message`` event); the request carries the W3C ``traceparent``
  of that step and the run labels as ``baggage``, so an agent that extracts them continues the trace
  (its spans, labelled, are children of the step). Options (``--agent-opt``): ``model``
  (default ``default``), ``api_key`` (default ``$OPENAI_API_KEY``), ``timeout`` seconds (default 30).
- a builtin name (``example``: the bundled court-booking agent, registered by the command layer).

A target turns a list of user turns into an :class:`Outcome`: the agent's own failure (the example
agent's failed steps) is a result of a run that ran to its end; an agent that raised or could not
be reached makes a ``stopped`` outcome (the run could not run to its end), never an exception out
of ``converse``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import urlparse

from opentelemetry.trace import Status, StatusCode

from tracedag import instrument as td
from tracedag.schemas.errors import TracedagError

Message = dict[str, Any]


class ReplayTargetError(TracedagError):  # type: ignore[misc,unused-ignore]
    """An ``--agent`` that cannot be loaded or an ``--agent-opt`` it does not take."""


@dataclass(frozen=True)
class RunInfo:
    """What a target may use of the run it plays: ids for seeding, the source conversation."""

    run_id: str
    conversation_id: str
    replay_index: int
    variant_id: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a replayed conversation came to: the replies, and the error when the run failed;
    ``stopped`` when it could not run to its end (the agent raised, was unreachable, its task died)."""

    replies: tuple[str, ...] = ()
    error: str | None = None
    stopped: bool = False

    @property
    def failed(self) -> bool:
        """True when the run failed."""
        return self.error is not None


class Target(Protocol):
    """An agent a replay can hold conversations with."""

    name: str
    service_name: str
    service_version: str | None

    def converse(self, turns: Sequence[str], run: RunInfo) -> Outcome:
        """Hold one conversation made of the user's ``turns``."""


TargetFactory = Callable[[Mapping[str, str]], Target]


def describe_error(exc: BaseException) -> str:
    """One line: the exception's type and message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class TurnTarget:
    """Calls a function once per user turn with the conversation so far; collects the replies."""

    name: str
    turn: Callable[[list[Message]], str]
    service_name: str = "agent"
    service_version: str | None = None
    wrap: Callable[[list[Message], Callable[[], str]], str] | None = field(default=None, repr=False)

    def converse(self, turns: Sequence[str], run: RunInfo) -> Outcome:
        """Each turn in order; the first one that raises ends the run as failed."""
        history: list[Message] = []
        replies: list[str] = []
        for i, text in enumerate(turns):
            history.append({"role": "user", "content": text})
            try:
                reply = self._call(history)
            except Exception as exc:
                if self.wrap is None:  # the agent's own spans may not show it: the store does
                    record_failure(exc, text)
                return Outcome(tuple(replies), f"turn {i + 1}: {describe_error(exc)}", stopped=True)
            replies.append(reply)
            history.append({"role": "assistant", "content": reply})
        return Outcome(tuple(replies))

    def _call(self, history: list[Message]) -> str:
        snapshot = [dict(m) for m in history]
        if self.wrap is not None:
            return self.wrap(snapshot, lambda: self.turn(snapshot))
        return self.turn(snapshot)


def record_failure(exc: BaseException, user_message: str | None = None) -> None:
    """One ``replay_error`` span (status ERROR, ``error.type``, the user's message as an event), inside
    the run's labels: the failed run is in the store even when the agent recorded nothing."""
    with td.tracer().start_as_current_span("replay_error") as span:
        if user_message:
            td.user_message(user_message)
        span.set_attribute("error.type", td.error_type(exc))
        span.set_status(Status(StatusCode.ERROR, describe_error(exc)))


def callable_target(spec: str) -> TurnTarget:
    """``module:function`` as a target (sync or async)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ReplayTargetError(f"--agent {spec!r}: expected module:function, an http(s):// URL or 'example'")
    if os.getcwd() not in sys.path:  # modules of the working directory, as `python -m` finds them
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ReplayTargetError(f"--agent {spec}: cannot import {module_name}: {describe_error(e)}") from e
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ReplayTargetError(f"--agent {spec}: {module_name} has no callable {attr}")
    return TurnTarget(spec, _sync(fn), service_name=module_name.rsplit(".", 1)[-1])


def _sync(fn: Callable[..., Any]) -> Callable[[list[Message]], str]:
    def call(history: list[Message]) -> str:
        result = fn(history)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return "" if result is None else str(result)

    return call


async def _await(awaitable: Any) -> Any:
    return await awaitable


def endpoint_target(url: str, opts: Mapping[str, str]) -> TurnTarget:
    """An OpenAI-compatible chat-completions endpoint, each turn traced as one agent step."""
    _only(opts, {"model", "api_key", "timeout"}, url)
    try:
        import openai
    except ImportError as e:  # the optional dependency of the judge
        raise ReplayTargetError("an endpoint agent needs the openai client: pip install 'tracedag[judge]'") from e
    try:
        timeout = float(opts.get("timeout", "30"))
    except ValueError as e:
        raise ReplayTargetError(f"--agent-opt timeout={opts['timeout']!r}: not a number of seconds") from e
    client = openai.OpenAI(base_url=url, api_key=opts.get("api_key") or os.environ.get("OPENAI_API_KEY") or "replay",
                           timeout=timeout, max_retries=0)
    model = opts.get("model", "default")
    host = urlparse(url).netloc or url

    def turn(history: list[Message]) -> str:
        try:
            reply = client.chat.completions.create(model=model, messages=history,  # type: ignore[arg-type]
                                                   extra_headers={**td.propagation_headers(), **RUN_HEADERS.get()})
        except openai.APITimeoutError as e:
            raise EndpointFailed(f"endpoint {url} timed out after {timeout:g} s") from e
        except openai.APIConnectionError as e:
            raise EndpointFailed(f"endpoint {url} refused the connection or is unreachable") from e
        except openai.APIStatusError as e:
            raise EndpointFailed(f"endpoint {url} answered HTTP {e.status_code}") from e
        choice = reply.choices[0]
        return choice.message.content or ""

    def traced(history: list[Message], call: Callable[[], str]) -> str:
        with td.agent(f"endpoint {host}") as step:
            step.set("gen_ai.request.model", model)
            step.set_input(history)
            td.user_message(str(history[-1]["content"]))
            text = call()
            step.set_output(text, finish_reason="stop")
            return text

    return TurnTarget(url, turn, service_name=f"endpoint {host}", wrap=traced)


RUN_HEADERS: ContextVar[Mapping[str, str]] = ContextVar("tracedag_replay_run_headers", default=MappingProxyType({}))
"""Headers an endpoint target adds to the requests of the current run (``tracedag confirm``: the base URL
of the model proxy serving the run, ``confirm_proxy``)."""


class EndpointFailed(Exception):
    """The endpoint refused, timed out or answered with an error status."""


def _only(opts: Mapping[str, str], allowed: set[str], agent: str) -> None:
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise ReplayTargetError(f"--agent-opt {unknown[0]}: not an option of {agent} "
                                f"(options: {', '.join(sorted(allowed))})")


def parse_opts(pairs: Sequence[str]) -> dict[str, str]:
    """``name=value`` strings as a dict."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ReplayTargetError(f"--agent-opt {pair!r}: expected name=value")
        out[name.strip()] = value.strip()
    return out


def load_target(spec: str, opts: Mapping[str, str], builtins: Mapping[str, TargetFactory]) -> Target:
    """The target ``spec`` names: a builtin, an http(s) URL, or ``module:function``."""
    if spec in builtins:
        return builtins[spec](opts)
    if spec.startswith(("http://", "https://")):
        return endpoint_target(spec, opts)
    if opts:
        raise ReplayTargetError(f"--agent-opt is not taken by a module:function agent ({spec})")
    return callable_target(spec)
