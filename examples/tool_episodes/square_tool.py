"""The square tool of the tool-episodes example: a worker speaking ``dew-sandbox``'s JSON-lines
protocol (standard library only; ``dew.sandbox.SubprocessEnvironment`` starts one per episode).

Token ids: 1 ends a turn (EOS), 2 CALL, 3 SAY, 4..13 the digits 0-9, 14 QUESTION.

- ``reset`` shows ``[QUESTION, digit(x)]`` with ``x = task % 4``.
- A turn ``[CALL, EOS]`` asks the tool: the next context is the conversation so far with
  ``digit(x * x)`` appended.
- A turn ``[SAY, d, EOS]`` answers and ends the episode; its verdict (the ``detail`` that
  ``verifier: outcome`` reads as the reward) is ``"1"`` when ``d`` is the digit of ``x * x``,
  else ``"0"``. Any other turn ends the episode with ``"0"``.
"""

import base64
import json
import sys

EOS, CALL, SAY, QUESTION = 1, 2, 3, 14


def digit(n):
    return 4 + n


def reply_to(request, state):
    op = request["op"]
    if op == "reset":
        state["x"] = request["episode"]["task"] % 4
        return {"context": [QUESTION, digit(state["x"])], "status": "running"}
    if op == "step":
        body = [t for t in request["tokens"] if t != EOS]
        if body == [CALL]:
            context = request["context"] + request["tokens"] + [digit(state["x"] ** 2)]
            return {"context": context, "status": "running"}
        right = body == [SAY, digit(state["x"] ** 2)]
        return {"context": None, "status": "completed", "detail": "1" if right else "0"}
    if op == "get_state":
        return {"state": base64.b64encode(json.dumps(state).encode()).decode()}
    if op == "set_state":
        state.update(json.loads(base64.b64decode(request["state"])))
        return {"restored": True}
    return {"error": f"unknown op {op!r}"}


def main():
    state = {"x": 0}
    for line in sys.stdin:
        print(json.dumps(reply_to(json.loads(line), state)), flush=True)


if __name__ == "__main__":
    main()
