"""Audit whether a chat template keeps multi-turn histories append-only, and how sessions chain.

Dew's packer (``dew.sessions.pack``) merges call ``k + 1`` into call ``k``'s chain
only when the next prompt starts with every id of the chain so far: the previous prompt and
the ids the model sampled. Whether that happens depends on the chat template: many templates
rewrite an earlier assistant turn when they render it as history (drop its reasoning,
re-serialize its tool-call arguments), and then every turn opens a new chain.

Two commands (run with ``uv run python tools/audit_template.py ...``):

``template --tokenizer DIR``
    Renders one short tool conversation for each kind of turn: with and without reasoning,
    the tool's result sent back as a tool-role or a user-role message, and the tool-call
    arguments as an object, as a JSON string, or sampled as compact JSON but sent back parsed
    (``compact``); plus a turn without a tool call. The sampled turn is taken to be what the
    template writes for a *final* assistant turn (so each family's own reasoning and tool-call
    syntax is used), cut after the end-of-turn token. A kind of turn merges when the ids of the
    next prompt start with the ids of the previous prompt followed by the sampled ids. Prints
    one table row per kind of turn, with where the texts part when they do.

``sessions traces.jsonl``
    Reads recorded calls, one JSON object per line as the rllm-model-gateway writes its trace
    records (``session_id``, ``prompt_token_ids``, ``completion_token_ids``; Dew's own
    spellings ``session``, ``prompt_ids``, ``sampled_ids`` also work), groups them by session
    in file order and prints calls, chains and calls per chain, per session and in total.

Bad input (a missing tokenizer directory, a malformed line) ends with one line on stderr that
names it, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SYSTEM = "You are a careful assistant. Use the tools when they help."
QUESTION = "What is 12 times 7?"
REASONING = "The user wants 12 * 7. I will call multiply."
ARGUMENTS = {"a": 12, "b": 7}
COMPACT = json.dumps(ARGUMENTS, separators=(",", ":"))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
STYLES = ("none", "object", "string", "compact")


class AuditError(Exception):
    """Bad input; printed as one line."""


@dataclass(frozen=True)
class Case:
    reasoning: bool
    observation: str  # "tool" or "user"
    style: str  # one of STYLES


@dataclass(frozen=True)
class Finding:
    case: Case
    merges: bool
    where: str


def cases() -> list[Case]:
    """Every kind of turn: a tool call only comes back through a tool-role message."""
    out = []
    for reasoning in (False, True):
        for observation in ("tool", "user"):
            for style in STYLES:
                if style == "none" and observation == "tool":
                    continue
                out.append(Case(reasoning, observation, style))
    return out


def assistant_turn(case: Case, arguments: Any) -> dict[str, Any]:
    """The assistant message, with the tool call's arguments as given."""
    message: dict[str, Any] = {"role": "assistant"}
    if case.style == "none":
        message["content"] = "12 times 7 is 84."
    else:
        message["content"] = "Let me compute it."
        call = {"type": "function", "function": {"name": "multiply", "arguments": arguments}}
        message["tool_calls"] = [call]
    if case.reasoning:
        message["reasoning_content"] = REASONING
    return message


def observation(case: Case) -> dict[str, Any]:
    if case.observation == "tool":
        return {"role": "tool", "content": "84"}
    return {"role": "user", "content": "The tool returned 84. Is that right?"}


def _part(a: str, b: str) -> str:
    """Where two texts first differ, shown as a short repr of each side."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"char {at}: sampled {a[at : at + 24]!r} vs history {b[at : at + 24]!r}"


def audit(chat: Any, case: Case, eos: str | None) -> Finding:
    """Render one kind of turn and check that the next prompt extends prompt + sampled ids."""
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    tools = TOOLS if case.style != "none" else None
    sampled_args = {"object": ARGUMENTS, "string": COMPACT, "compact": COMPACT}.get(case.style)
    sent_args = {"object": ARGUMENTS, "string": COMPACT, "compact": ARGUMENTS}.get(case.style)
    prompt = chat.render(history, tools=tools, add_generation_prompt=True)
    final = chat.render(history + [assistant_turn(case, sampled_args)], tools=tools)
    if not final.startswith(prompt):
        return Finding(case, False, "the final assistant turn does not extend the prompt")
    sampled = final[len(prompt) :]
    if eos and eos in sampled:
        sampled = sampled[: sampled.index(eos) + len(eos)]
    turns = history + [assistant_turn(case, sent_args), observation(case)]
    following = chat.render(turns, tools=tools, add_generation_prompt=True)
    ids = chat.encode(prompt) + chat.encode(sampled)
    next_ids = chat.encode(following)
    if next_ids[: len(ids)] == ids:
        return Finding(case, True, "-")
    if following.startswith(prompt + sampled):
        return Finding(case, False, "the texts extend but the ids differ at the boundary")
    return Finding(case, False, _part(prompt + sampled, following))


def table(findings: Sequence[Finding]) -> str:
    head = ("reasoning", "observation", "arguments", "merges", "calls/chain", "where it splits")
    rows = [
        (
            "yes" if f.case.reasoning else "no",
            f.case.observation,
            f.case.style,
            "yes" if f.merges else "no",
            "2" if f.merges else "1",
            f.where,
        )
        for f in findings
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_template(directory: str, eos: str | None) -> str:
    if not os.path.isdir(directory):
        raise AuditError(f"--tokenizer {directory!r}: not a directory")
    from dew.data.chat.template import load_chat_tokenizer

    try:
        chat = load_chat_tokenizer(directory, field="--tokenizer")
    except (OSError, ValueError) as err:
        raise AuditError(f"--tokenizer {directory!r}: {err}") from None
    eos = eos or chat.special.get("eos_token")
    findings = [audit(chat, case, eos) for case in cases()]
    merged = sum(f.merges for f in findings)
    return (
        f"chat template of {directory} (sampled turn cut after {eos!r})\n{table(findings)}\n"
        f"{merged} of {len(findings)} kinds of turn keep the history append-only"
    )


# ---------------------------------------------------------------- sessions


def _field(record: dict[str, Any], names: tuple[str, ...], label: str) -> Any:
    for name in names:
        if name in record:
            return record[name]
    raise AuditError(f"{label}: missing field {names[0]!r} (or {', '.join(names[1:])})")


def read_traces(path: str) -> dict[str, list[Any]]:
    """Calls grouped by session, in file order (one ``Call`` per line)."""
    if not os.path.isfile(path):
        raise AuditError(f"{path}: no such file")
    from dew.sessions import Call

    sessions: dict[str, list[Any]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            label = f"{path}:{number}"
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise AuditError(f"{label}: not a JSON line ({err.msg})") from None
            if not isinstance(record, dict):
                raise AuditError(f"{label}: expected a JSON object, got {type(record).__name__}")
            session = _field(record, ("session_id", "session"), label)
            if not isinstance(session, str | int) or isinstance(session, bool):
                raise AuditError(f"{label}: session_id: expected a string, got {session!r}")
            prompt = _field(record, ("prompt_token_ids", "prompt_ids"), label)
            sampled = _field(record, ("completion_token_ids", "sampled_ids"), label)
            try:
                n = len(sampled) if isinstance(sampled, list) else 0
                call = Call(prompt, sampled, [0.0] * n)
            except (TypeError, ValueError) as err:
                raise AuditError(f"{label}: {err}") from None
            sessions.setdefault(str(session), []).append(call)
    if not sessions:
        raise AuditError(f"{path}: no trace records")
    return sessions


def run_sessions(path: str) -> str:
    sessions = read_traces(path)
    from dew.sessions import Session
    from dew.sessions.chains import chains_of

    head = ("session", "calls", "chains", "calls/chain")
    rows = []
    total_calls = total_chains = 0
    for index, (name, calls) in enumerate(sessions.items()):
        chains = len(chains_of(Session(task=name, calls=calls), index))
        total_calls += len(calls)
        total_chains += chains
        rows.append((name, str(len(calls)), str(chains), f"{len(calls) / chains:.2f}"))
    rows.append(("all", str(total_calls), str(total_chains), f"{total_calls / total_chains:.2f}"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return f"{len(sessions)} sessions in {path}\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    template = commands.add_parser("template", help="append-only check of a chat template")
    template.add_argument("--tokenizer", required=True, help="a tokenizer directory")
    template.add_argument("--eos", default=None, help="end-of-turn text (default: eos_token)")
    traces = commands.add_parser("sessions", help="calls per chain of recorded sessions")
    traces.add_argument("traces", help="a traces.jsonl file")
    args = parser.parse_args(argv)
    try:
        if args.command == "template":
            print(run_template(args.tokenizer, args.eos))
        else:
            print(run_sessions(args.traces))
    except AuditError as err:
        print(f"audit_template: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
