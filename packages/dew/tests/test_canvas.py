"""CanvasGeneration on a tiny bidirectional decoder: draws fixed by the key, one compiled
program per shape, block-by-block filling and the one-line errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dew.inference.canvas import Canvas, CanvasGeneration, CanvasOutput
from dew.sampling import Sampling
from dew.testing import tiny_decoder

MASK, REAL, VOCAB, MAX_LEN = 11, 11, 12, 32


@pytest.fixture(scope="module")
def model_and_variables():
    model = tiny_decoder(VOCAB, MAX_LEN, init_std=0.5)
    return model, model.init(jax.random.key(0), np.zeros((1, 8), np.int32))


@pytest.fixture(scope="module")
def low_confidence(model_and_variables):
    """LLaDA remasking, two blocks of 4, two steps per block."""
    model, variables = model_and_variables
    canvas = Canvas(MASK, REAL, steps=4, remasking="low_confidence", block_length=4)
    gen = CanvasGeneration(model, variables, canvas=canvas)
    sampling = Sampling(temperature=1.0, top_k=6)
    first = gen([[1, 2, 3], [4, 5]], 8, 0, sampling)
    return gen, sampling, first


def test_low_confidence_fills_block_by_block(low_confidence) -> None:
    _, _, outs = low_confidence
    for out in outs:
        assert out.ids.shape == (8,) and not np.any(out.ids == MASK)
        # block 0 (positions 0..3) at steps 0-1, block 1 at steps 2-3, two tokens a step
        assert set(out.order[:4]) <= {0, 1} and set(out.order[4:]) <= {2, 3}
        np.testing.assert_array_equal(np.bincount(out.order, minlength=4), [2, 2, 2, 2])


def test_draws_follow_the_key_and_one_program_serves_every_call(low_confidence) -> None:
    gen, sampling, first = low_confidence
    again = gen([[1, 2, 3], [4, 5]], 8, 0, sampling)
    other = gen([[6, 2, 3], [4, 7]], 8, 1, sampling)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.order, b.order)
    assert any(not np.array_equal(a.ids, b.ids) for a, b in zip(first, other))
    assert gen.compile_count == 1


def test_ancestral_block_causal_with_noise_removal(model_and_variables) -> None:
    model, variables = model_and_variables
    canvas = Canvas(MASK, REAL, steps=4, remasking="ancestral", block_length=4, block_causal=True)
    gen = CanvasGeneration(model, variables, canvas=canvas)
    out = gen([1, 2, 3, 4], 8, 3, Sampling(temperature=0.0))
    assert not np.any(out.ids == MASK)
    # two steps and one noise-removal pass per block: iterations 0-2, then 3-5
    assert set(out.order[:4]) <= {0, 1, 2} and set(out.order[4:]) <= {3, 4, 5}
    assert out.text_ids.shape == (8,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps: expected a positive int, got 0"),
        ({"steps": -2}, "steps: expected a positive int, got -2"),
        ({"mask_id": 5}, "mask_id: 5 is inside the data's real tokens 0..10"),
        ({"remasking": "random"}, "remasking: expected one of"),
        ({"block_causal": True}, "block_causal: block-causal attention needs a block_length"),
    ],
)
def test_canvas_refuses_bad_settings(kwargs, message) -> None:
    settings = {"mask_id": MASK, "real_tokens": REAL, "steps": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        Canvas(**settings)


@pytest.mark.parametrize(
    ("canvas", "prompt", "gen_length", "sampling", "message"),
    [
        (Canvas(MASK, REAL, 4, block_length=3), [1], 8, None, "block_length: 3 does not divide"),
        (Canvas(MASK, REAL, 3, block_length=4), [1], 8, None, "steps: 3 is not divisible by"),
        (Canvas(MASK, REAL, 4), [1] * 20, 16, None, "gen_length: a canvas of 20 prompt"),
        (Canvas(MASK, REAL, 4), [1, MASK], 8, None, r"prompt_ids\[0\]: ids must lie in"),
        (
            Canvas(MASK, REAL, 4, block_length=4, block_causal=True),
            [1],
            8,
            None,
            r"prompt_ids\[0\]: length 1 is not a multiple of block_length=4",
        ),  # fmt: skip
        (
            Canvas(MASK, REAL, 4),
            [1],
            8,
            Sampling(top_k=2, return_support=True),
            "sampling.return_support",
        ),  # fmt: skip
    ],
)
def test_generation_refuses_bad_calls(model_and_variables, canvas, prompt, gen_length,
                                      sampling, message) -> None:  # fmt: skip
    model, variables = model_and_variables
    gen = CanvasGeneration(model, variables, canvas=canvas)
    with pytest.raises(ValueError, match=message):
        gen(prompt, gen_length, 0, sampling)
    assert gen.compile_count == 0


def test_mask_id_outside_the_vocabulary(model_and_variables) -> None:
    model, _ = model_and_variables
    with pytest.raises(ValueError, match="mask_id: 12 is outside the model's vocab_size=12"):
        CanvasGeneration(model, canvas=Canvas(12, REAL, 4))


def test_text_ids_stop_before_the_first_eos() -> None:
    out = CanvasOutput(np.array([4, 2, 3, 2, 3]), np.arange(5), eos_ids=(3,))
    np.testing.assert_array_equal(out.text_ids, [4, 2])
    np.testing.assert_array_equal(CanvasOutput(out.ids, out.order).text_ids, out.ids)
