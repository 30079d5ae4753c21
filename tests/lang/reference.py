"""A small tuple-at-a-time Datalog evaluator, written to be obviously correct, not fast.

Naive evaluation stratum by stratum; bindings are dicts; each rule is evaluated by backtracking
over its positive atoms, then checking comparisons and negated atoms.
"""

from __future__ import annotations

import math
import operator

from tensorlogic.lang.ast import Arith, Atom, Comparison, Const, Literal, Rule, Var


class RefError(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _cmp(op, a, b):
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    if isinstance(a, str) != isinstance(b, str):
        return False
    return {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op](a, b)


def _match(atom, row, binding):
    b = dict(binding)
    for t, v in zip(atom.args, row):
        if isinstance(t, Const):
            if not (t.value == v):
                return None
        elif t.anonymous:
            continue
        elif t.name in b:
            if not (b[t.name] == v):
                return None
        else:
            b[t.name] = v
    return b


_UNBOUND = object()
_UNDEFINED = object()


def _arith(op, a, b):
    if isinstance(a, str) or isinstance(b, str):
        return _UNDEFINED
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return _UNDEFINED
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        q = q if (a >= 0) == (b >= 0) else -q
        return q if op == "/" else a - b * q
    return a / b if op == "/" else math.fmod(a, b)


def _value(t, b):
    if isinstance(t, Const):
        return t.value
    if isinstance(t, Var):
        return b.get(t.name, _UNBOUND)
    left, right = _value(t.left, b), _value(t.right, b)
    if left is _UNBOUND or right is _UNBOUND:
        return _UNBOUND
    if left is _UNDEFINED or right is _UNDEFINED:
        return _UNDEFINED
    return _arith(t.op, left, right)


def _vars(t):
    if isinstance(t, Var):
        return [t]
    if isinstance(t, Arith):
        return _vars(t.left) + _vars(t.right)
    return []


def _lift(rule: Rule) -> Rule:
    """Arithmetic arguments of body atoms as fresh variables equal to them."""
    extra, body = [], []
    for x in rule.body:
        if isinstance(x, Literal) and any(isinstance(t, Arith) for t in x.atom.args):
            args = []
            for t in x.atom.args:
                if isinstance(t, Arith):
                    v = Var(f"$ref{len(extra)}")
                    extra.append(Comparison("=", v, t))
                    t = v
                args.append(t)
            x = Literal(Atom(x.atom.pred, tuple(args)), x.negated)
        body.append(x)
    return Rule(rule.head, tuple(body) + tuple(extra))


def _solutions(rule: Rule, db):
    positives = [x.atom for x in rule.body if isinstance(x, Literal) and not x.negated]
    rest = [x for x in rule.body if not (isinstance(x, Literal) and not x.negated)]

    def go(k, b):
        if k == len(positives):
            yield b
            return
        atom = positives[k]
        for row in db.get(atom.pred, set()):
            nb = _match(atom, row, b)
            if nb is not None:
                yield from go(k + 1, nb)

    for b in go(0, {}):
        todo = list(rest)
        ok = True
        while todo and ok:
            progress = False
            for item in list(todo):
                if isinstance(item, Comparison):
                    lv, rv = _value(item.left, b), _value(item.right, b)
                    if (
                        item.op == "="
                        and (lv is _UNBOUND) != (rv is _UNBOUND)
                        and isinstance(item.left if lv is _UNBOUND else item.right, Var)
                    ):
                        var = item.left if lv is _UNBOUND else item.right
                        val = rv if lv is _UNBOUND else lv
                        if val is _UNDEFINED:
                            ok = False
                        else:
                            b = {**b, var.name: val}
                    elif lv is _UNBOUND or rv is _UNBOUND:
                        continue
                    elif lv is _UNDEFINED or rv is _UNDEFINED or not _cmp(item.op, lv, rv):
                        ok = False
                else:
                    atom = item.atom
                    if any(
                        isinstance(t, Var) and not t.anonymous and t.name not in b
                        for t in atom.args
                    ):
                        continue
                    if any(_match(atom, row, b) is not None for row in db.get(atom.pred, set())):
                        ok = False
                todo.remove(item)
                progress = True
                break
            if not progress:
                raise RefError("unbound_variable")
        if ok:
            yield b


def _check(rules, facts):
    arity = {}
    for r in rules:
        for a in [r.head] + [x.atom for x in r.body if isinstance(x, Literal)]:
            if arity.setdefault(a.pred, len(a.args)) != len(a.args):
                raise RefError("arity_mismatch")
    for p, rows in facts.items():
        for row in rows:
            if arity.setdefault(p, len(row)) != len(row):
                raise RefError("arity_mismatch")
    for r in rules:
        r = _lift(r)
        bound = {
            t.name
            for x in r.body
            if isinstance(x, Literal) and not x.negated
            for t in x.atom.args
            if isinstance(t, Var)
        }
        grow = True
        while grow:
            grow = False
            for x in r.body:
                if isinstance(x, Comparison) and x.op == "=":
                    for u, v in ((x.left, x.right), (x.right, x.left)):
                        if (
                            isinstance(u, Var)
                            and u.name not in bound
                            and all(w.name in bound for w in _vars(v))
                        ):
                            bound.add(u.name)
                            grow = True
        for t in r.head.args:
            for v in _vars(t):
                if v.anonymous or v.name not in bound:
                    raise RefError("unbound_variable")
        for x in r.body:
            ts = (
                x.atom.args
                if isinstance(x, Literal) and x.negated
                else ((x.left, x.right) if isinstance(x, Comparison) else ())
            )
            for t in ts:
                for v in _vars(t):
                    if isinstance(x, Comparison) and v.anonymous:
                        raise RefError("unbound_variable")
                    if not v.anonymous and v.name not in bound:
                        raise RefError("unbound_variable")
    return arity


def evaluate(rules: list[Rule], facts: dict[str, set]) -> dict[str, set]:
    """The least model of a stratified program; raises RefError(code) for bad programs."""
    arity = _check(rules, facts)
    rules = [_lift(r) for r in rules]
    db = {p: set() for p in arity}
    for p, rows in facts.items():
        db.setdefault(p, set()).update(tuple(r) for r in rows)
    preds = sorted(db)
    level = {p: 0 for p in preds}
    changed = True
    while changed:
        changed = False
        for r in rules:
            for x in r.body:
                if isinstance(x, Literal):
                    need = level[x.atom.pred] + (1 if x.negated else 0)
                    if level[r.head.pred] < need:
                        level[r.head.pred] = need
                        changed = True
                        if need > len(preds):
                            raise RefError("cyclic_negation")
    for s in range(max(level.values(), default=0) + 1):
        stratum_rules = [r for r in rules if level[r.head.pred] == s]
        while True:
            new = set()
            for r in stratum_rules:
                for b in _solutions(r, db):
                    row = tuple(_value(t, b) for t in r.head.args)
                    if any(v is _UNDEFINED for v in row):
                        continue
                    if row not in db[r.head.pred]:
                        new.add((r.head.pred, row))
            if not new:
                break
            for p, row in new:
                db[p].add(row)
    return db
