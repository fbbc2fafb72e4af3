"""Read the last ``\\boxed{...}`` answer of a completion and turn it into an exact rational.

Two pure functions, used by :class:`dew.rewards.MathReward`:

* :func:`last_boxed` finds the last ``\\boxed{...}`` (or ``\\fbox{...}``) and returns what is
  inside its braces, matching nested braces; ``None`` when there is no complete box.
* :func:`to_fraction` parses an answer string into a :class:`fractions.Fraction`, or returns
  ``None`` when the answer is not a plain rational expression.

Normalisation before parsing, in this order:

1. Outer ``$`` signs, ``\\left``/``\\right``, the spacing commands ``\\! \\, \\; \\: \\quad``
   and a trailing full stop are removed; the Unicode minus ``−`` becomes ``-``.
2. ``\\text{...}``, ``\\textbf{...}``, ``\\mathrm{...}`` and ``\\mathbf{...}`` keep only their
   contents; ``\\dfrac`` and ``\\tfrac`` are read as ``\\frac``; ``\\frac{a}{b}`` (also the short
   ``\\frac12``) becomes ``(a)/(b)``, nested fractions included; ``\\cdot``/``\\times`` become
   ``*``; the remaining braces group like parentheses.
3. A number is an integer or a decimal (``2``, ``2.50``, ``.5``). Thousands separators are
   accepted only in the strict form ``1,234,567`` (and LaTeX's ``1{,}234``): a comma
   anywhere else makes the answer non-numeric, so a list such as ``1,2`` is never read as 12.
4. The expression may use ``+ - * /``, unary signs and parentheses. Division by zero,
   exponents, roots, percent signs, units and variables are not rational here.

Decimals are exact: ``0.5`` equals ``1/2`` but ``0.333`` does not equal ``1/3``.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{")
_SPACING = re.compile(r"\\[!,;:]|\\quad|\\qquad|\\left|\\right|\\displaystyle")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+")


def _group_end(text: str, open_index: int) -> int | None:
    """Index just past the ``}`` that closes the ``{`` at ``open_index``, or None."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def last_boxed(text: str) -> str | None:
    """Contents of the last complete ``\\boxed{...}`` in ``text`` (nested braces allowed).

    Returns None when ``text`` has no box or its last box is never closed.
    """
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    end = _group_end(text, last.end() - 1)
    if end is None:
        return None
    return text[last.end() : end - 1]


def _unwrap_commands(text: str) -> str:
    """Replace ``\\text{x}``-style wrappers by ``x`` (innermost last, braces matched)."""
    while (match := _TEXT.search(text)) is not None:
        end = _group_end(text, match.end() - 1)
        if end is None:
            return text
        text = text[: match.start()] + text[match.end() : end - 1] + text[end:]
    return text


def _fraction_argument(text: str, index: int) -> tuple[str, int] | None:
    """One ``\\frac`` argument starting at ``index``: a braced group or a single character."""
    while index < len(text) and text[index].isspace():
        index += 1
    if index >= len(text):
        return None
    if text[index] == "{":
        end = _group_end(text, index)
        if end is None:
            return None
        return text[index + 1 : end - 1], end
    if text[index] in "}\\":
        return None
    return text[index], index + 1


def _expand_fractions(text: str) -> str | None:
    """Rewrite every ``\\frac{a}{b}`` as ``((a)/(b))``; None on a malformed fraction."""
    out: list[str] = []
    index = 0
    while (start := text.find("\\frac", index)) >= 0:
        out.append(text[index:start])
        numerator = _fraction_argument(text, start + len("\\frac"))
        if numerator is None:
            return None
        denominator = _fraction_argument(text, numerator[1])
        if denominator is None:
            return None
        top = _expand_fractions(numerator[0])
        bottom = _expand_fractions(denominator[0])
        if top is None or bottom is None:
            return None
        out.append(f"(({top})/({bottom}))")
        index = denominator[1]
    out.append(text[index:])
    return "".join(out)


def normalize(answer: str) -> str:
    """The answer with the LaTeX decorations of step 1 and 2 above removed (no parsing)."""
    text = answer.strip().replace("−", "-")
    text = text.strip("$").strip()
    text = text.rstrip(".").strip()
    text = _SPACING.sub("", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.replace("{,}", ",")
    return _unwrap_commands(text)


def _tokens(text: str) -> list[str] | None:
    """Numbers, operators and parentheses of ``text``; None on anything else."""
    tokens: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char.isspace():
            index += 1
            continue
        if char in "+-*/()":
            tokens.append(char)
            index += 1
            continue
        match = _NUMBER.match(text, index)
        if match is None:
            return None
        tokens.append(match.group().replace(",", ""))
        index = match.end()
    return tokens


class _Parser:
    """Recursive descent over ``expr := term (('+'|'-') term)*`` with exact Fractions."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.index = 0

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.index += 1
        return token

    def expression(self) -> Fraction | None:
        value = self.term()
        while value is not None and self.peek() in ("+", "-"):
            operator = self.take()
            right = self.term()
            if right is None:
                return None
            value = value + right if operator == "+" else value - right
        return value

    def term(self) -> Fraction | None:
        value = self.unary()
        while value is not None and self.peek() in ("*", "/"):
            operator = self.take()
            right = self.unary()
            if right is None:
                return None
            if operator == "*":
                value = value * right
            elif right == 0:
                return None
            else:
                value = value / right
        return value

    def unary(self) -> Fraction | None:
        token = self.peek()
        if token in ("+", "-"):
            self.take()
            value = self.unary()
            if value is None:
                return None
            return -value if token == "-" else value
        return self.atom()

    def atom(self) -> Fraction | None:
        token = self.take()
        if token is None:
            return None
        if token == "(":
            value = self.expression()
            if self.take() != ")":
                return None
            return value
        if token in "+-*/)":
            return None
        return Fraction(token)


def to_fraction(answer: str) -> Fraction | None:
    """The exact rational value of ``answer``, or None when it is not one (see module doc)."""
    text = _expand_fractions(normalize(answer))
    if text is None:
        return None
    text = text.replace("\\cdot", "*").replace("\\times", "*")
    text = text.replace("{", "(").replace("}", ")")
    tokens = _tokens(text)
    if not tokens:
        return None
    parser = _Parser(tokens)
    value = parser.expression()
    if value is None or parser.index != len(tokens):
        return None
    return value
