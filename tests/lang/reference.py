"""A small tuple-at-a-time Datalog evaluator, written to be obviously correct, not fast.

Naive evaluation stratum by stratum; bindings are dicts; each rule is evaluated by backtracking
over its positive atoms, then checking comparisons and negated atoms.
"""

from __future__ import annotations

import operator

from tensorlogic.lang.ast import Comparison, Const, Literal, Rule, Var


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


def _value(t, b):
    return t.value if isinstance(t, Const) else b.get(t.name, _UNBOUND)


_UNBOUND = object()


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
                    if item.op == "=" and (lv is _UNBOUND) != (rv is _UNBOUND):
                        var = item.left if lv is _UNBOUND else item.right
                        b = {**b, var.name: rv if lv is _UNBOUND else lv}
                    elif lv is _UNBOUND or rv is _UNBOUND:
                        continue
                    elif not _cmp(item.op, lv, rv):
                        ok = False
                else:
                    atom = item.atom
                    if any(isinstance(t, Var) and not t.anonymous and t.name not in b
                           for t in atom.args):
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
        bound = {t.name for x in r.body if isinstance(x, Literal) and not x.negated
                 for t in x.atom.args if isinstance(t, Var)}
        grow = True
        while grow:
            grow = False
            for x in r.body:
                if isinstance(x, Comparison) and x.op == "=":
                    for u, v in ((x.left, x.right), (x.right, x.left)):
                        if isinstance(u, Var) and u.name not in bound and (
                                isinstance(v, Const) or v.name in bound):
                            bound.add(u.name)
                            grow = True
        for t in r.head.args:
            if isinstance(t, Var) and (t.anonymous or t.name not in bound):
                raise RefError("unbound_variable")
        for x in r.body:
            ts = x.atom.args if isinstance(x, Literal) and x.negated else (
                (x.left, x.right) if isinstance(x, Comparison) else ())
            for t in ts:
                if isinstance(t, Var) and not t.anonymous and t.name not in bound:
                    raise RefError("unbound_variable")
    return arity


def evaluate(rules: list[Rule], facts: dict[str, set]) -> dict[str, set]:
    """The least model of a stratified program; raises RefError(code) for bad programs."""
    arity = _check(rules, facts)
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
                    if row not in db[r.head.pred]:
                        new.add((r.head.pred, row))
            if not new:
                break
            for p, row in new:
                db[p].add(row)
    return db
