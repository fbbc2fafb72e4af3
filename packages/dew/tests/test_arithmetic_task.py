"""The arithmetic task (``dew.data.arithmetic``), its BPE chat tokenizer (``dew.data.chat.bpe``),
``prompt_ids`` and held-out accuracy (``dew.rewards.accuracy``): what ``dew quickstart``
builds on, exported from their rooms."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from dew.data.arithmetic import Problem, all_problems, careless, split
from dew.data.chat.bpe import END, build_tokenizer, token_id
from dew.rewards import MathReward
from dew.rewards.accuracy import Accuracy, changed, standard_error
from dew.rewards.math_answer import last_boxed


def test_the_rooms_export_what_the_quickstart_and_the_examples_read() -> None:
    import dew.data
    import dew.data.arithmetic
    import dew.data.chat
    import dew.data.chat.bpe
    import dew.data.chat.template
    import dew.rewards
    import dew.rewards.accuracy

    assert dew.data.Problem is Problem and "Problem" in dew.data.__all__
    for name in ("build_tokenizer", "save_tokenizer", "token_id", "vocab_size"):
        assert getattr(dew.data.chat, name) is getattr(dew.data.chat.bpe, name)
        assert name in dew.data.chat.__all__
    assert dew.data.chat.prompt_ids is dew.data.chat.template.prompt_ids
    for name in ("Accuracy", "Evaluator", "changed", "standard_error"):
        assert getattr(dew.rewards, name) is getattr(dew.rewards.accuracy, name)
        assert name in dew.rewards.__all__
    with pytest.raises(AttributeError, match="no attribute 'careless'"):
        dew.data.chat.careless  # noqa: B018


def test_prompt_ids_are_the_question_and_the_generation_prompt() -> None:
    from dew.data.chat import prompt_ids

    tok = build_tokenizer(p.worked() for p in all_problems(10))
    ids = prompt_ids(tok, "3+4")
    assert tok.decode(ids) == "<|user|>3+4<|end|><|assistant|>"
    assert ids == tok.encode("<|user|>3+4<|end|><|assistant|>")


def test_split_is_disjoint_and_seeded():
    a, b = split(20, 30, seed=0), split(20, 30, seed=1)
    assert len(a.held_out) == 30 and len(a.train) + 30 == len(all_problems(20))
    assert not set(a.train) & set(a.held_out)
    assert a.held_out != b.held_out
    assert split(20, 30, seed=0) == a
    with pytest.raises(ValueError, match="held_out"):
        split(3, 100, seed=0)


def test_worked_answers_box_the_exact_result_and_slips_do_not():
    reward = MathReward()
    rng = np.random.default_rng(0)
    for problem in all_problems(30)[::7]:
        exact = problem.a + problem.b if problem.op == "+" else problem.a - problem.b
        assert Fraction(last_boxed(problem.worked())) == exact
        assert reward("", problem.worked(), str(exact), "") == 1.0
        assert reward("", problem.wrong(rng), str(exact), "") == 0.0
    assert all_problems(100)[0].worked() == "0+0=0 \\boxed{0}"


def test_the_careless_tutor_drops_hundreds_and_forgets_borrows_and_nothing_else():
    reward = MathReward()
    kinds = {"hundreds": 0, "borrow": 0, "none": 0}
    for problem in all_problems(100):
        careless = problem.careless()
        steps = problem.worked().rsplit(" ", 1)[0]
        if problem.op == "+" and problem.answer >= 100:
            kinds["hundreds"] += 1  # the steps are right, the box lacks its leading 1
            assert careless == steps + f" \\boxed{{{problem.answer - 100}}}"
        elif problem.op == "-" and problem.a >= 10 and problem.a % 10 < problem.b % 10:
            kinds["borrow"] += 1  # the borrow into the tens column is forgotten
            assert careless == problem.worked(1) and careless.split(" ")[0] == steps.split(" ")[0]
        else:
            kinds["none"] += 1
            assert careless is None
            continue
        assert reward("", careless, str(problem.answer), "") == 0.0
    assert kinds == {"hundreds": 4950, "borrow": 2025, "none": 8075}
    assert Problem(95, "+", 48).careless() == "5+8=13 9+4+1=14 \\boxed{43}"
    assert Problem(52, "-", 17).careless() == "12-7=5 5-1=4 \\boxed{45}"


def test_careless_demonstrations_are_a_seeded_share_of_the_problems_that_have_one():
    problems = split(100, 1000, seed=0).train
    eligible = [p.careless() is not None for p in problems]
    picked = careless(problems, 0.7, seed=0)
    assert picked == careless(problems, 0.7, seed=0) != careless(problems, 0.7, seed=1)
    assert not any(c and not e for c, e in zip(picked, eligible, strict=True))
    share = sum(picked) / sum(eligible)
    assert abs(share - 0.7) < 3 * np.sqrt(0.7 * 0.3 / sum(eligible))
    assert not any(careless(problems, 0.0, seed=0))
    assert careless(problems, 1.0, seed=0) == eligible


def test_tokenizer_reads_digits_one_by_one_and_round_trips():
    problems = all_problems(30)
    tok = build_tokenizer(p.worked() for p in problems)
    text = "<|user|>37+48<|end|><|assistant|>" + problems[100].worked() + END
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    digits = [tok.decode([i]) for i in tok.encode("1234")]
    assert digits == ["1", "2", "3", "4"]
    assert ids[-1] == token_id(tok, END)
    rendered = tok.render([{"role": "user", "content": "2+2"}], add_generation_prompt=True)
    assert rendered == "<|user|>2+2<|end|><|assistant|>"


def test_standard_error_and_changed_examples():
    assert standard_error(0.5, 100) == pytest.approx(0.05)
    assert standard_error(1.0, 10) == 0.0
    questions = ("1+1", "2+2", "3+3", "4+4")
    before = Accuracy(0.5, 2, 4, questions, ("a", "b", "c", "d"), (True, False, False, True))
    after = Accuracy(0.5, 2, 4, questions, ("a", "B", "c", "D"), (True, True, False, False))
    assert after.standard_error == pytest.approx(0.25)
    out = changed(before, after)
    assert [(c["question"], c["correct_after"]) for c in out] == [("2+2", True), ("4+4", False)]
    assert out[0]["before"] == "b" and out[0]["after"] == "B"
    assert changed(before, after, fixed=0, broken=0) == []
    other = Accuracy(0.5, 2, 4, ("9+9",) * 4, ("",) * 4, (True,) * 4)
    with pytest.raises(ValueError, match="same held-out questions"):
        changed(before, other)


def test_code_form_of_a_problem() -> None:
    problem = Problem(37, "+", 48)
    assert problem.code_question == "python 37+48"
    assert problem.program() == "```python\nprint(37+48)\n```"
    assert json.loads(problem.code_tests()) == [{"stdin": "", "stdout": "85"}]
