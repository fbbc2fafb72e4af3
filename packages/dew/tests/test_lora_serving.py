"""Serving a base with a LoRA adapter, applied on the fly (a `LoraDecoder`) or merged into
the weights: `TextGeneration`, `Server` and ``dew generate --adapter`` give the same greedy
tokens either way, log-probs within 1e-5, and not the base's; the log-probs are those of a
teacher-forced `LoraDecoder` forward; bad ``--adapter`` input is one line, exit 2."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dew.cli import main
from dew.inference import Server, TextGeneration
from dew.inference.adapter import with_adapter
from dew.models import Pretrained, build
from dew.models.lora import (
    PROJECTIONS,
    LoraConfig,
    LoraDecoder,
    init_adapters,
    save_peft_adapter,
)
from dew.sampling import Sampling

SHAPE = dict(vocab_size=32, emb_features=16, num_layers=1, num_heads=2, num_kv_heads=1,
             mlp_features=32, max_seq_len=24, tie_embeddings=False)  # fmt: skip
LORA = LoraConfig(rank=4, alpha=8, targets=PROJECTIONS)
CONTEXTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7]]
NEW = 8
GREEDY = Sampling(temperature=0.0)


def _noisy(adapters, seed=1, scale=0.5):
    """The same tree with every factor random (b no longer zero, so the adapter matters)."""
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        tree, [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )


@pytest.fixture(scope="module")
def setup():
    """The base, a random adapter, and greedy generations of base / unmerged / merged."""
    model = build("llama", **SHAPE)
    variables = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    adapters = _noisy(init_adapters(jax.random.key(2), model.config, LORA))
    pairs = {
        "base": (model, variables),
        "unmerged": with_adapter(model, variables, adapters, LORA),
        "merged": with_adapter(model, variables, adapters, LORA, merge=True),
    }
    gens = {name: TextGeneration(m, v)(CONTEXTS, NEW, 0, GREEDY) for name, (m, v) in pairs.items()}
    return {"model": model, "variables": variables, "adapters": adapters, "pairs": pairs,
            "gens": gens}  # fmt: skip


def test_with_adapter_builds_a_lora_decoder_or_merged_weights(setup):
    unmerged_model, unmerged_vars = setup["pairs"]["unmerged"]
    merged_model, merged_vars = setup["pairs"]["merged"]
    assert isinstance(unmerged_model, LoraDecoder) and unmerged_model.lora == LORA
    assert set(unmerged_vars) == {"params", "base"}
    assert not isinstance(merged_model, LoraDecoder) and set(merged_vars) == {"params"}
    base_q = setup["variables"]["params"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
    merged_q = merged_vars["params"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
    assert merged_q.shape == base_q.shape and not np.allclose(merged_q, base_q)


def test_unmerged_and_merged_generate_the_same_tokens_not_the_bases(setup):
    gens = setup["gens"]
    for unmerged, merged in zip(gens["unmerged"], gens["merged"]):
        assert len(unmerged) == NEW
        np.testing.assert_array_equal(unmerged.ids, merged.ids)
        np.testing.assert_allclose(unmerged.raw_log_probs, merged.raw_log_probs, atol=1e-5)
    ids = {name: [gen.ids.tolist() for gen in gens[name]] for name in ("unmerged", "base")}
    assert all(u != b for u, b in zip(ids["unmerged"], ids["base"]))


def test_generated_log_probs_are_the_adapters_teacher_forced_ones(setup):
    model, variables = setup["pairs"]["unmerged"]
    chains = np.zeros((len(CONTEXTS), 24), np.int32)  # right padding: scored positions unchanged
    for row, (context, gen) in enumerate(zip(CONTEXTS, setup["gens"]["unmerged"])):
        chain = [*context, *gen.ids.tolist()]
        chains[row, : len(chain)] = chain
    scores = np.asarray(jax.jit(lambda v, ids: jax.nn.log_softmax(model.apply(v, ids)))(
        variables, chains))  # fmt: skip
    for row, (context, gen) in enumerate(zip(CONTEXTS, setup["gens"]["unmerged"])):
        want = scores[row, len(context) - 1 + np.arange(NEW), gen.ids]
        np.testing.assert_allclose(gen.raw_log_probs, want, atol=1e-5)


def _serve(server):
    ids = [server.submit(c, NEW) for c in CONTEXTS]
    done = server.run()
    return [done[i] for i in ids]


@pytest.fixture(scope="module")
def servers(setup):
    """A `Server` per way of serving the adapter, with its first answers."""
    out = {}
    for name in ("unmerged", "merged"):
        server = Server(*setup["pairs"][name], slots=2, capacity=24, min_window=16)
        out[name] = (server, _serve(server))
    return out


def test_server_answers_as_text_generation_unmerged_and_merged(setup, servers):
    for name in ("unmerged", "merged"):
        for completion, gen in zip(servers[name][1], setup["gens"]["unmerged"]):
            np.testing.assert_array_equal(completion.ids, gen.ids)
            np.testing.assert_allclose(completion.raw_log_probs, gen.raw_log_probs, atol=1e-5)


def test_server_reloads_a_new_adapter_beside_the_same_base(setup, servers):
    server = servers["unmerged"][0]
    zero = init_adapters(jax.random.key(5), setup["model"].config, LORA)  # b = 0: the base
    assert server.reload({"params": zero, "base": setup["variables"]["params"]}) == 1
    for completion, gen in zip(_serve(server), setup["gens"]["base"]):
        np.testing.assert_array_equal(completion.ids, gen.ids)
        np.testing.assert_allclose(completion.raw_log_probs, gen.raw_log_probs, atol=1e-5)


def test_server_refuses_an_adapter_without_its_base(setup):
    model, _ = setup["pairs"]["unmerged"]
    with pytest.raises(ValueError, match="'base' collection"):
        Server(model, {"params": setup["adapters"]}, slots=1, capacity=24)


@pytest.fixture(scope="module")
def dirs(setup, tmp_path_factory):
    """The base saved in the Hugging Face layout, the adapter in PEFT's, and token prompts."""
    root = tmp_path_factory.mktemp("lora_serving")
    Pretrained.from_model(setup["model"], setup["variables"]).save(root / "base", "float32")
    save_peft_adapter(root / "adapter", setup["adapters"], setup["model"].config, LORA)
    other = build("llama", **{**SHAPE, "emb_features": 24})
    save_peft_adapter(root / "other", init_adapters(jax.random.key(1), other.config, LORA),
                      other.config, LORA)  # fmt: skip
    (root / "empty").mkdir()
    (root / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": c, "ground_truth": "7"}) + "\n" for c in CONTEXTS)
    )
    return root


def _generate(dirs, out, *flags):
    return main(["generate", str(dirs / "base"), "--prompts", str(dirs / "prompts.jsonl"),
                 "--max-prompt-len", "16", "--max-new-tokens", str(NEW), "--temperature", "0",
                 "--out", str(out), *flags])  # fmt: skip


def test_cli_generate_writes_the_same_completions_unmerged_and_merged(setup, dirs, capsys):
    # the prompt and budget buckets (16 + 16) exceed the base's max_seq_len of 24: the
    # recipe widens the LoraDecoder, keeping its adapter
    ids = {}
    for name, flags in (("unmerged", ()), ("merged", ("--merge-adapter",))):
        out = dirs / f"{name}.jsonl"
        assert _generate(dirs, out, "--adapter", str(dirs / "adapter"), *flags) == 0
        assert f"+ adapter {dirs / 'adapter'} ({name})" in capsys.readouterr().out
        ids[name] = [json.loads(line)["ids"] for line in out.read_text().splitlines()]
    want = [gen.ids.tolist() for gen in setup["gens"]["unmerged"]]
    assert ids["unmerged"] == ids["merged"] == want
    assert want != [gen.ids.tolist() for gen in setup["gens"]["base"]]


def test_cli_eval_scores_the_adapters_completions(setup, dirs, capsys):
    out = dirs / "eval.json"
    code = main(["eval", str(dirs / "base"), "--adapter", str(dirs / "adapter"), "--prompts",
                 str(dirs / "prompts.jsonl"), "--reward", "math", "--max-prompt-len", "16",
                 "--max-new-tokens", str(NEW), "--out", str(out)])  # fmt: skip
    assert code == 0
    assert f"+ adapter {dirs / 'adapter'} (unmerged)" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["ids"] for r in rows] == [gen.ids.tolist() for gen in setup["gens"]["unmerged"]]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (("--adapter", "{empty}"), "dew: error: --adapter: expected a PEFT adapter directory "
         "holding adapter_config.json"),
        (("--adapter", "{other}"), "dew: error: --adapter: "),
        (("--adapter", "{missing}"), "dew: error: --adapter: no such directory"),
        (("--merge-adapter",), "dew: error: --merge-adapter: expected --adapter DIR"),
    ],
)  # fmt: skip
def test_bad_adapter_input_is_one_line_and_exit_2(dirs, tmp_path, capsys, flags, expected):
    names = {"empty": dirs / "empty", "other": dirs / "other", "missing": dirs / "missing"}
    out = tmp_path / "out.jsonl"
    code = _generate(dirs, out, *(f.format(**names) for f in flags))
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(expected) and err.count("\n") == 1, err
    assert not out.exists()


def test_an_adapter_for_another_base_names_the_shape(dirs, capsys):
    code = _generate(dirs, dirs / "never.jsonl", "--adapter", str(dirs / "other"))
    err = capsys.readouterr().err
    assert code == 2 and "expected shape" in err and "another base shape" in err, err


def test_a_lora_run_directory_as_model_points_at_the_base_and_its_adapter(tmp_path, capsys):
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": CONTEXTS[0]}) + "\n")
    run = tmp_path / "lora-run"
    (run / "checkpoints").mkdir(parents=True)
    config = {"kind": "lm", "run": {}, "model": {"pretrained": "models/base"},
              "lora": {"rank": 4, "alpha": 8.0}}  # fmt: skip
    (run / "config.json").write_text(json.dumps(config))
    code = main(["generate", str(run), "--prompts", str(tmp_path / "prompts.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "is a LoRA run" in err and f"--adapter {run / 'adapter'}" in err, err
    assert "(models/base)" in err, err
