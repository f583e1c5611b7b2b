"""A small, safe filter language for tabulations (``--where`` / ``where=``).

A filter is parsed with Python's ``ast`` and evaluated as boolean masks over a frame's columns;
nothing in it is ever executed as code. Allowed: column names, string and number literals,
comparisons (== != < <= > >=, chained), ``in [..]`` / ``not in [..]`` with a list or tuple of
literals, ``and`` / ``or`` / ``not`` and parentheses, e.g.
``sector == '31-33' and county in ['001', '003'] and not m1emp < 10``. Anything else (attributes,
calls, subscripts, arithmetic, lambdas, names that are not columns) is refused in one line naming
the construct.
"""

from __future__ import annotations

import ast
import operator

import numpy as np
import pandas as pd

#: The longest filter accepted (a filter is a line, not a program).
MAX_FILTER_CHARACTERS = 2000

COMPARISONS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
               ast.Gt: operator.gt, ast.GtE: operator.ge}


SYMBOLS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


class FilterError(ValueError):
    """A filter outside the language, or naming a column the frame does not have."""


def _construct(node: ast.AST) -> str:
    """A short name of a syntax node for messages ("a function call", "an attribute (.x)")."""
    if isinstance(node, ast.Attribute):
        return f"an attribute (.{node.attr[:40]})"
    if isinstance(node, ast.Constant):
        return f"the literal {str(node.value)[:40]}"
    names = {ast.Call: "a function call", ast.Subscript: "a subscript", ast.Lambda: "a lambda",
             ast.BinOp: "arithmetic", ast.UnaryOp: "arithmetic", ast.Starred: "a starred expression",
             ast.IfExp: "a conditional expression", ast.NamedExpr: "an assignment",
             ast.Name: "a bare column"}
    return names.get(type(node), f"a {type(node).__name__} expression")


def parse_filter(where: str) -> ast.expr:
    """The syntax tree of a filter; FilterError when it does not parse as one expression."""
    if not isinstance(where, str) or len(where) > MAX_FILTER_CHARACTERS:
        raise FilterError(f"a filter is a text of at most {MAX_FILTER_CHARACTERS} characters")
    try:
        return ast.parse(where.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise FilterError("not a filter expression (columns, comparisons, in [..], and / or / not)") from None


def _literal(node: ast.AST) -> str | int | float:
    """A string or number literal (a leading minus allowed), else FilterError."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = _literal(node.operand)
        if isinstance(value, str):
            raise FilterError("a minus sign before a string is not allowed")
        return -value
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    raise FilterError(f"{_construct(node)} is not allowed; use columns, literals, comparisons, in, and/or/not")


def _operand(node: ast.AST, frame: pd.DataFrame) -> object:
    """A column (its values) or a literal."""
    if isinstance(node, ast.Name):
        if node.id not in frame.columns:
            raise FilterError(f"{node.id[:40]!r} is not a column (columns: {', '.join(map(str, frame.columns))})")
        return frame[node.id]
    return _literal(node)


def _membership(left: object, node: ast.AST, negated: bool) -> np.ndarray:
    if not isinstance(node, (ast.List, ast.Tuple)):
        raise FilterError(f"in needs a list of literals, e.g. county in ['001', '003']; got {_construct(node)}")
    if not isinstance(left, pd.Series):
        raise FilterError("in needs a column on its left")
    values = [_literal(element) for element in node.elts]
    for value in values:
        _same_kind(left, value, "in")
    inside = left.isin(values).to_numpy()
    return ~inside if negated else inside


def _comparison(node: ast.Compare, frame: pd.DataFrame) -> np.ndarray:
    keep = np.ones(len(frame), dtype=bool)
    left = _operand(node.left, frame)
    for op, right_node in zip(node.ops, node.comparators):
        if isinstance(op, (ast.In, ast.NotIn)):
            keep &= _membership(left, right_node, isinstance(op, ast.NotIn))
            continue
        if type(op) not in COMPARISONS:
            raise FilterError(f"the comparison {type(op).__name__} is not allowed; use == != < <= > >= in, not in")
        right = _operand(right_node, frame)
        _same_kind(left, right, SYMBOLS[type(op)])
        try:
            result = COMPARISONS[type(op)](left, right)
        except TypeError:
            raise FilterError("a comparison of a text with a number (quote codes: sector == '23')") from None
        keep &= np.broadcast_to(np.asarray(result, dtype=bool), keep.shape)
        left = right
    return keep


def _holds_text(column: pd.Series) -> bool:
    """Whether a column holds text (codes), categories of text included."""
    kind = column.dtype
    if isinstance(kind, pd.CategoricalDtype):
        return pd.api.types.is_string_dtype(kind.categories)
    return pd.api.types.is_string_dtype(kind)


def _same_kind(left: object, right: object, op: str) -> None:
    """Refuse a column of text compared with a number (``naics3 == 236`` keeps nothing: codes are
    text) or a numeric column with a text, with the comparison as it should be written."""
    column, literal = (left, right) if isinstance(left, pd.Series) else (right, left)
    if not isinstance(column, pd.Series) or isinstance(literal, pd.Series):
        return
    name = str(column.name)[:40]
    if isinstance(literal, (int, float)) and _holds_text(column):
        codes = column.dropna()
        width = len(str(codes.iloc[0])) if len(codes) else 0
        text = f"'{str(literal).zfill(width) if isinstance(literal, int) and literal >= 0 else literal}'"
        rule = f"column {name!r} holds codes as text, and {literal} is a number, which no code equals"
    elif isinstance(literal, str) and pd.api.types.is_numeric_dtype(column.dtype):
        text = literal[:40]
        rule = f"column {name!r} holds numbers, and {literal[:40]!r} is a text"
    else:
        return
    written = f"{name} in [{text}]" if op == "in" else (
        f"{name} {op} {text}" if column is left else f"{text} {op} {name}")
    raise FilterError(f"{rule}; hint: {'quote it' if text.startswith(chr(39)) else 'write it unquoted'}, {written}")


def evaluate_filter(tree: ast.AST, frame: pd.DataFrame) -> np.ndarray:
    """The boolean mask of ``frame``'s rows that a parsed filter keeps."""
    if isinstance(tree, ast.BoolOp):
        masks = [evaluate_filter(value, frame) for value in tree.values]
        return np.logical_and.reduce(masks) if isinstance(tree.op, ast.And) else np.logical_or.reduce(masks)
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not):
        return ~evaluate_filter(tree.operand, frame)
    if isinstance(tree, ast.Compare):
        return _comparison(tree, frame)
    raise FilterError(f"{_construct(tree)} is not a condition; use comparisons joined by and / or / not")


def select_rows(frame: pd.DataFrame, where: str) -> np.ndarray:
    """Which rows of ``frame`` the filter ``where`` keeps (FilterError names what is not allowed)."""
    return evaluate_filter(parse_filter(where), frame)
