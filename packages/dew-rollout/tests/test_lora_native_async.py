"""``dew train grpo`` with a ``lora`` section drawing asynchronously from the native server.

The server runs the ``LoraDecoder`` unmerged (``NativeAdapterServer``): the run trains three
updates, its pushes carry the adapter alone (the journal keeps adapter trees, the served base
stays the same arrays, equal to the pretrained base), every draw made under one adapter
version scores as the ``LoraDecoder`` does with that adapter, and the last adapter served is
the one written to ``RUN_DIR/adapter``."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dew.cli import main
from dew.models import Pretrained, build
from dew.models.lora import LoraConfig, LoraDecoder, load_peft_adapter
from dew.objectives.lora import base_digest
from dew.rollout import recipe
from dew.rollout.native_adapter import NativeAdapterServer
from dew.trainer import checkpoint as ckpt

SHAPE = dict(vocab_size=32, emb_features=16, num_layers=1, num_heads=2, num_kv_heads=1,
             mlp_features=32, max_seq_len=32, tie_embeddings=False)  # fmt: skip
TARGETS = ["q_proj", "v_proj", "down_proj"]
STEPS = 3
REWARD = """def even(data_source, completion, ground_truth, extra_info):
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))
"""


class Watched(NativeAdapterServer):
    """The run's server, recording what each push loaded, the served base after it, and
    every finished draw with the versions served when it was submitted and when it ended."""

    made: list[Watched] = []

    def __init__(self, server):
        super().__init__(server)
        self.loaded: dict[int, object] = {0: self.select(server.variables)}
        self.bases = [self.base]
        self.draws: list[tuple[int, int, object]] = []
        Watched.made.append(self)

    def load(self, variables, version):
        super().load(variables, version)
        self.loaded[int(version)] = jax.device_get(self.select(variables))
        self.bases.append(self.base)

    def submit(self, prompt_ids, max_new_tokens, *, seed=None):
        start = self.version
        future = super().submit(prompt_ids, max_new_tokens, seed=seed)
        future.add_done_callback(lambda f: self._ended(start, f))
        return future

    def _ended(self, start, future):
        if not future.cancelled() and future.exception() is None:
            self.draws.append((start, self.version, future.result()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Run the config once: its folders, the pretrained base's params and the server."""
    base = tmp_path_factory.mktemp("lora_native")
    model = build("llama", **SHAPE)
    variables = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    params = jax.tree.map(np.asarray, variables["params"])
    Pretrained.from_model(model, {"params": params}).save(base / "policy", dtype="float32")
    rows = [{"prompt": [1 + i % 5, 2, 3 + i % 7], "ground_truth": "x"} for i in range(8)]
    (base / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (base / "rewards_lora_native.py").write_text(REWARD)
    run_dir = base / "run"
    config = {
        "run": {"run_dir": str(run_dir), "steps": STEPS, "batch": 2, "log_every": 1,
                "checkpoint_every": 1, "progress": False},
        "model": {"pretrained": str(base / "policy")},
        "optimizer": {"name": "adam", "learning_rate": 5e-2},
        "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
        "objective": {"reward": "rewards_lora_native:even", "groups": 2, "max_new_tokens": 6,
                      "behavior_importance": 2.0},
        "lora": {"rank": 2, "alpha": 4, "targets": TARGETS},
        "rollout": {"mode": "async", "ahead": 1, "truncation": "score",
                    "engine": {"kind": "native"}},
    }  # fmt: skip
    path = base / "run.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    mp = pytest.MonkeyPatch()
    mp.chdir(base)
    mp.syspath_prepend(str(base))
    mp.setattr(recipe, "NativeAdapterServer", Watched)
    Watched.made.clear()
    try:
        assert main(["train", "grpo", "--config", str(path)]) == 0
    finally:
        mp.undo()
    (server,) = Watched.made
    return {"run_dir": run_dir, "params": params, "server": server, "model": model}


def _leaves(tree):
    return [np.asarray(x, np.float32) for x in jax.tree.leaves(tree)]


def test_versions_advance_and_pushes_carry_the_adapter_alone(trained):
    run_dir, server = trained["run_dir"], trained["server"]
    drawn = [json.loads(line) for line in open(run_dir / "rollout.jsonl")]
    assert [r["index"] for r in drawn] == [0, 1, 2]
    assert [r["version"] for r in drawn] == [0, 0, 1]
    assert [r["pushed"] for r in drawn] == [-1, 1, 2]
    # versions 1 and 2 pushed by the scheduler, version 3 (the trained adapter) at the end
    assert sorted(server.loaded) == [0, 1, 2, 3] and server.version == STEPS
    adapter_leaves = len(jax.tree.leaves(server.loaded[0]))
    assert adapter_leaves == 2 * len(TARGETS)  # a and b per target, no base
    journal = sorted((run_dir / "rollout-journal").glob("weights-*.npz"))
    assert [p.name for p in journal] == ["weights-1.npz", "weights-2.npz"]
    for path in journal:
        with np.load(path) as kept:
            assert len(kept.files) == adapter_leaves
            version = int(path.stem.split("-")[1])
            for got, want in zip([kept[f"arr_{i}"] for i in range(adapter_leaves)],
                                 _leaves(server.loaded[version]), strict=True):  # fmt: skip
                np.testing.assert_array_equal(got, want)
    # each pushed adapter differs from the one before: the training moved it
    for older, newer in zip(range(STEPS), range(1, STEPS + 1)):
        assert any(not np.array_equal(a, b) for a, b in
                   zip(_leaves(server.loaded[older]), _leaves(server.loaded[newer])))  # fmt: skip


def test_the_base_stays_bit_identical(trained):
    server, params, run_dir = trained["server"], trained["params"], trained["run_dir"]
    first = jax.tree.leaves(server.bases[0])
    for base in server.bases[1:]:  # the same arrays served at every version
        assert all(a is b for a, b in zip(first, jax.tree.leaves(base), strict=True))
    for got, want in zip(first, jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    ((_, newest),) = ckpt.list_checkpoints(run_dir)[-1:]
    meta = json.load(open(f"{newest}/meta.json"))
    assert meta["extra"]["frozen"]["sha256"] == base_digest(params)  # the trainer's base too


def test_draws_score_as_the_lora_decoder_of_their_version(trained):
    server, params = trained["server"], trained["params"]
    lora = server.lora
    decoder = LoraDecoder(trained["model"].config, lora)
    scores = jax.jit(lambda v, ids: jax.nn.log_softmax(decoder.apply(v, ids), axis=-1))
    steady = [(v, d) for v, end, d in server.draws if v == end and len(d.ids)]
    assert {0, 1} <= {v for v, _ in steady}, [(v, e) for v, e, _ in server.draws]
    for version, draw in steady:
        chain = np.concatenate([draw.prompt_ids, draw.ids]).astype(np.int32)[None]
        variables = {"params": server.loaded[version], "base": params}
        got = np.asarray(scores(variables, chain))[0]
        start = len(draw.prompt_ids) - 1
        want = got[start + np.arange(len(draw.ids)), draw.ids]
        np.testing.assert_allclose(draw.raw_log_probs, want, atol=1e-5)


def test_the_last_served_adapter_is_the_exported_one(trained):
    server, run_dir = trained["server"], trained["run_dir"]
    exported, lora = load_peft_adapter(run_dir / "adapter", trained["model"].config)
    assert isinstance(lora, LoraConfig) and lora.targets == tuple(TARGETS) and lora.rank == 2
    served = server.loaded[STEPS]
    assert jax.tree.structure(served) == jax.tree.structure(exported)
    for got, want in zip(_leaves(served), _leaves(exported), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert any(np.abs(b).max() > 0 for b in _leaves(exported)[1::2])  # b started at zero


def test_a_plain_server_and_a_misshapen_adapter_are_refused_by_name(trained):
    from dew.inference import Server

    plain = Server(trained["model"], {"params": trained["params"]}, slots=1, capacity=16)
    with pytest.raises(TypeError, match=r"^server: expected a Server on a LoraDecoder"):
        NativeAdapterServer(plain)
    server = trained["server"]
    wrong = jax.tree.map(lambda x: np.zeros((x.shape[0] + 1, *x.shape[1:]), np.float32),
                         server.loaded[0])  # fmt: skip
    before = server.version
    with pytest.raises(ValueError):
        server.load(wrong, before + 1)
    assert server.version == before
