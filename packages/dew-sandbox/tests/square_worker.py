"""A JSON-lines square tool for SubprocessEnvironment tests (standard library only).

Ids: 1 EOS, 2 CALL, 3 SAY, 4..13 the digits 0-9, 14 QUESTION. ``reset`` answers the context
``[QUESTION, digit(task % 10)]``. A step whose tokens (EOS left out) are ``[CALL]`` appends
the digits of the square to the context; ``[SAY, digits...]`` completes the episode with the
answer as its detail; anything else completes it with ``invalid``.

``WORKER_MODE`` picks a misbehaviour on the first step: ``hang``, ``memory`` (allocates
1 GiB), ``crash`` (exit code 3), ``malformed`` (a line that is not JSON), ``badstatus``,
``oversized`` (a 64 KiB reply), ``refuse`` (an ``{"error"}`` reply). ``WORKER_SLEEP`` adds
that many seconds to every step. ``WORKER_AUDIT`` names a file that gets one line per
completed step (fsynced before the reply), so tests can count how often each ran.
``WORKER_PAUSE_FILE`` with ``WORKER_PAUSE_STEP``: the first step of an episode of that
training step, while the file does not exist yet, writes its pid there and hangs (a tool
call left pending, for crash tests).
"""

import base64
import json
import os
import sys
import time

EOS, CALL, SAY, QUESTION = 1, 2, 3, 14
MODE = os.environ.get("WORKER_MODE", "square")
AUDIT = os.environ.get("WORKER_AUDIT")
SLEEP = float(os.environ.get("WORKER_SLEEP", "0"))


def digits(n):
    return [4 + int(c) for c in str(n)]


def misbehave():
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "memory":
        hog = bytearray(1 << 30)
        hog[-1] = 1
    if MODE == "crash":
        sys.stderr.write("square worker: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    if MODE == "malformed":
        return "{this is not json"
    if MODE == "badstatus":
        return json.dumps({"context": [1], "status": "finished", "detail": ""})
    if MODE == "oversized":
        return json.dumps({"context": None, "status": "completed", "detail": "x" * (64 << 10)})
    if MODE == "refuse":
        return json.dumps({"error": "no tool for that"})
    return None


def pause():
    path = os.environ.get("WORKER_PAUSE_FILE")
    step = os.environ.get("WORKER_PAUSE_STEP")
    if not path or os.path.exists(path) or STATE["episode"]["step"] != int(step):
        return
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(3600)


STATE = {}


def main():
    state = {"episode": None, "x": 0, "calls": 0}
    for line in sys.stdin:
        STATE["episode"] = state["episode"]
        request = json.loads(line)
        op = request["op"]
        if op == "reset":
            state["episode"] = STATE["episode"] = request["episode"]
            state["x"] = request["episode"]["task"] % 10
            reply = {"context": [QUESTION, *digits(state["x"])], "status": "running"}
        elif op == "step":
            odd = misbehave()
            if odd is not None:
                print(odd, flush=True)
                continue
            pause()
            if SLEEP:
                time.sleep(SLEEP)
            state["calls"] += 1
            if AUDIT:
                with open(AUDIT, "a") as audit:
                    record = {**state["episode"], "call": state["calls"]}
                    audit.write(json.dumps(record, sort_keys=True) + "\n")
                    audit.flush()
                    os.fsync(audit.fileno())
            body = [t for t in request["tokens"] if t != EOS]
            if body == [CALL]:
                context = request["context"] + request["tokens"] + digits(state["x"] ** 2)
                reply = {"context": context, "status": "running", "detail": ""}
            elif body[:1] == [SAY]:
                answer = "".join(str(t - 4) if 4 <= t <= 13 else "?" for t in body[1:])
                reply = {"context": None, "status": "completed", "detail": answer}
            else:
                reply = {"context": None, "status": "completed", "detail": "invalid"}
        elif op == "get_state":
            blob = json.dumps(state).encode()
            reply = {"state": base64.b64encode(blob).decode()}
        elif op == "set_state":
            state = json.loads(base64.b64decode(request["state"]))
            reply = {"restored": True}
        else:
            reply = {"error": f"unknown op {op!r}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
