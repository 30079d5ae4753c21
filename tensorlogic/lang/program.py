"""Program: a parsed TensorLogic program; ``run`` evaluates it, ``query`` reads a relation.

Evaluation goes one way: Datalog rules first (stratum by stratum, recursive strata to a
fixpoint), then the tensor equations as one compiled graph that may read the relations as dense
0/1 tensors (indexed by each domain's sorted constants, see ``Program.symbols``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.compile import compile as compile_graph
from ..errors import ProgramError, SerializationError, UnknownPredicateError
from ..ir.graph import EinsumGraph
from .analysis import program_error
from .ast import ProgramAST, Rule
from .equations import build_equations, refs_of
from .facts import normalize_facts, with_declared
from .fixpoint import Analysis, Options, decode_all, evaluate_rules
from .parser import parse_ast
from .relation import Relation


class Program:
    """A parsed program: Datalog ``rules``, tensor ``equations`` and data ``declarations``."""

    def __init__(self, ast: ProgramAST, source: str = "<string>") -> None:
        self.ast = ast
        self.source = source
        self._last: tuple[Analysis, dict[str, Relation]] | None = None
        # tensors learned by ``fit``: run() reads them where no data is given
        self.params: dict[str, np.ndarray] = {}
        # what ``fit_weights`` learned
        self.rule_weights: dict[str, float] = {}
        self.fact_weights: dict[str, dict[tuple, float]] = {}
        self.weighted_relations: dict[str, np.ndarray] = {}
        lhs = {eq.lhs.name for eq in ast.equations}
        preds = {
            a.pred
            for r in ast.rules
            for a in [r.head] + [b.atom for b in r.body if hasattr(b, "atom")]
        }
        clash = sorted(lhs & preds)
        if clash:
            eq = next(e for e in ast.equations if e.lhs.name == clash[0])
            raise program_error(
                "name_conflict",
                f"{clash[0]!r} is both a relation of the rules "
                "and the left side of a tensor equation",
                eq.pos,
            )

    # ------------------------------------------------------------------ structure
    @property
    def rules(self) -> list[Rule]:
        """The Datalog rules and facts."""
        return list(self.ast.rules)

    @property
    def equations(self) -> list:
        """The tensor equations."""
        return list(self.ast.equations)

    @property
    def relations(self) -> tuple[str, ...]:
        """Relations the rules mention (facts given to ``run`` may add more)."""
        names = {
            a.pred
            for r in self.ast.rules
            for a in [r.head] + [b.atom for b in r.body if hasattr(b, "atom")]
        }
        return tuple(sorted(names))

    @property
    def tensors(self) -> tuple[str, ...]:
        """Left-side names of the tensor equations."""
        return tuple(dict.fromkeys(eq.lhs.name for eq in self.ast.equations))

    def __repr__(self) -> str:
        return (
            f"Program({self.source!r}: {len(self.ast.rules)} rules/facts, "
            f"{len(self.ast.equations)} equations, relations={list(self.relations)}, "
            f"tensors={list(self.tensors)})"
        )

    # ------------------------------------------------------------------ running
    def _fact_tables(self, given: dict) -> dict:
        """The facts as tables, with the program's ``.decl`` relations declared."""
        tables = normalize_facts(given)
        with_declared(tables, self.ast.relations)
        return tables

    def run(
        self,
        backend: str = "auto",
        *,
        facts: Mapping[str, Iterable] | None = None,
        semantics: str = "boolean",
        opt_level: int = 2,
        max_iterations: int | None = None,
        memory_budget: int | None = None,
        representation: str = "auto",
        **data: Any,
    ) -> dict[str, Any]:
        """Evaluate the program; returns every relation and equation result.

        A relation comes back as a dense numpy array (over ``symbols(name)``) when its dense
        form fits ``memory_budget``, else as a ``Relation`` (columns of values); use
        ``relation(name)`` for a ``Relation`` always.

        Args:
            backend: backend name or ``"auto"``.
            facts: extra facts, ``{predicate: facts}`` in any form ``evaluate`` takes.
            semantics: ``"boolean"``, ``"fuzzy"`` or ``"probabilistic"`` for the rules.
            representation: ``"auto"``, ``"dense"`` or ``"sparse"`` (see ``evaluate``).
            data: arrays for the tensors the equations read (declared or not); a relation of
                the rules given by keyword with anything but a numpy array (a list of tuples,
                a DataFrame, ...) is taken as its facts.
        """
        opts = Options(
            backend=backend, semantics=semantics, opt_level=opt_level, representation=representation
        )
        if max_iterations is not None:
            opts.max_iterations = max_iterations
        if memory_budget is not None:
            opts.memory_budget = memory_budget
        data = {**{k: v for k, v in self.params.items() if k not in data}, **data}
        given = dict(facts) if facts is not None else {}
        rel_names = set(self.relations)
        for name in [k for k in data if k in rel_names and not isinstance(data[k], np.ndarray)]:
            if name in given:
                raise ProgramError(
                    f"facts of {name!r} given twice: by keyword and in facts=", code="invalid_fact"
                )
            given[name] = data.pop(name)
        an, rels, _ = evaluate_rules(self.ast.rules, self._fact_tables(given), opts)
        out: dict[str, Any] = {}
        dense: dict[str, np.ndarray] = {}
        for name, r in rels.items():
            if 4 * math.prod(max(1, len(d)) for d in r._domains) <= opts.memory_budget:
                dense[name] = out[name] = r.to_dense()
            else:
                out[name] = r
        if self.ast.equations:
            out.update(self._run_equations(dense, data, opts))
        elif data:
            raise ProgramError(
                f"data {sorted(data)} given but the program has no tensor equations",
                code="missing_data",
            )
        self._last = (an, rels)  # only a run that succeeded replaces what query() reads
        return out

    def _run_equations(
        self, dense: Mapping[str, np.ndarray], data: Mapping[str, Any], opts: Options
    ) -> dict[str, np.ndarray]:
        g, outs, arrays, _ = self._equation_graph(dense, data, {})
        for name, t in outs.items():
            g.output(t, name=f"o_{name}") if t.id not in g.inputs.values() else g.output(
                t * 1.0, name=f"o_{name}"
            )
        plan = compile_graph(g, backend=opts.backend, opt_level=opts.opt_level)
        res = plan(arrays, to_host=True)
        return {name: np.asarray(res[f"o_{name}"]) for name in outs}

    def _equation_graph(
        self,
        dense: Mapping[str, np.ndarray],
        data: Mapping[str, Any],
        params: Mapping[str, np.ndarray],
    ):
        """The equations as one graph: data and relations as inputs, ``params`` as parameters.

        Returns the graph, each left side's tensor, the input arrays by input name, and the
        input name of each data tensor and relation.
        """
        decl = {d.name: d for d in self.ast.declarations}
        lhs = set(self.tensors)
        used = {r.name for eq in self.ast.equations for r in refs_of(eq.expr)}
        unknown = sorted(set(data) - used - set(decl))
        if unknown:
            raise ProgramError(
                f"data {unknown} is not read by any equation; the equations read "
                f"{sorted(used - lhs - set(dense))}",
                code="missing_data",
            )
        g = EinsumGraph()
        env = {}
        arrays: dict[str, np.ndarray] = {}
        names: dict[str, str] = {}
        for k, name in enumerate(sorted(used - lhs)):
            if name in params:
                env[name] = g.parameter(f"t{k}", params[name])
                names[name] = f"t{k}"
                continue
            if name in data:
                d = decl.get(name)
                arr = np.asarray(data[name], dtype=d.dtype if d else np.float32)
                if d is not None and d.shape is not None:
                    self._check_shape(d, arr.shape)
            elif name in dense:
                arr = dense[name]
            elif name in decl:
                raise program_error(
                    "missing_data",
                    f"tensor {name!r} is declared but no array was given to run()",
                    decl[name].pos,
                )
            else:
                continue  # reported with its position when the equation reads it
            iname = f"t{k}"
            env[name] = g.input(iname, arr.shape, arr.dtype)
            arrays[iname] = arr
            names[name] = iname
        outs = build_equations(g, self.ast.equations, env)
        return g, outs, arrays, names

    def fit(
        self,
        data: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        loss: str,
        params: Iterable[str],
        optimizer: Any = None,
        epochs: int = 1,
        init: Mapping[str, Any] | None = None,
        seed: int = 0,
        backend: str = "auto",
        opt_level: int = 2,
        facts: Mapping[str, Iterable] | None = None,
        semantics: str = "boolean",
        **train_options: Any,
    ) -> Any:
        """Learn the tensors ``params`` by gradient descent on the scalar tensor ``loss``.

        ``loss`` is the left side of an equation without indices (``Loss avg= ...``);
        ``params`` name tensors the equations read. Their starting values come from ``init``,
        else from an earlier ``fit``, else from a declaration with a concrete shape (``W:
        float32[16, 8]``: normal values scaled by 1/sqrt(size of the last axis), seeded by
        ``seed``; vectors and scalars start at zero). ``data`` is one dict of arrays (every
        epoch is then one step) or a list of such batches of equal shapes; the rules run
        first (with ``facts``) and their relations are read as dense tensors. The gradients
        come from ``tl.grad``, the loop is ``tl.train`` (``optimizer`` defaults to
        ``tl.optim.Adam()``; ``train_options`` such as ``progress``, ``on_error`` and
        ``checkpoint`` go to it). The learned values are kept in ``program.params``, which
        ``run`` reads where no array is given. Returns the training ``History``.
        """
        from ..autodiff import grad
        from ..learn import train
        from ..optim import Adam

        batches = [data] if isinstance(data, Mapping) else list(data)
        if not batches or not all(isinstance(b, Mapping) for b in batches):
            raise ProgramError(
                "fit: data must be a dict of arrays or a non-empty list of them",
                code="missing_data",
            )
        if loss not in self.tensors:
            raise ProgramError(
                f"fit: loss {loss!r} is not the left side of an equation; the "
                f"equations define {list(self.tensors)}",
                code="missing_data",
            )
        params = [params] if isinstance(params, str) else list(params)
        used = {r.name for eq in self.ast.equations for r in refs_of(eq.expr)}
        bad = [p for p in params if p not in used or p in self.tensors]
        if not params or bad:
            raise ProgramError(
                f"fit: params {bad or params} must name tensors the equations "
                f"read (not left sides); they read "
                f"{sorted(used - set(self.tensors))}",
                code="missing_data",
            )
        start = self._initial_params(params, dict(init or {}), seed)
        opts = Options(backend=backend, semantics=semantics, opt_level=opt_level)
        an, rels, _ = evaluate_rules(self.ast.rules, self._fact_tables(dict(facts or {})), opts)
        dense = {name: r.to_dense() for name, r in rels.items()}
        g, outs, arrays, names = self._equation_graph(dense, batches[0], start)
        node = outs[loss].node
        if tuple(node.shape) != ():
            raise ProgramError(
                f"fit: loss {loss!r} has shape {list(node.shape)}; expected a "
                "scalar (an equation whose left side has no indices)",
                code="shape_mismatch",
            )
        g.output(outs[loss], name="loss")
        pnames = [names[p] for p in params]
        plan = compile_graph(grad(g, of="loss", wrt=pnames), backend=backend, opt_level=opt_level)
        fixed = {
            k: v for k, v in arrays.items() if k not in {names[d] for d in batches[0] if d in names}
        }

        def feed(epoch: int):
            for b in batches:
                unknown = sorted(set(b) - set(names))
                if unknown:
                    raise ProgramError(
                        f"fit: data {unknown} is not read by any equation", code="missing_data"
                    )
                yield {
                    **fixed,
                    **{
                        names[k]: np.asarray(v, dtype=plan.graph.node(names[k]).dtype)
                        for k, v in b.items()
                    },
                }

        hist = train(plan, feed, epochs=epochs, optimizer=optimizer or Adam(), **train_options)
        self.params.update(
            {p: np.array(plan.backend.to_host(plan.parameters[names[p]])) for p in params}
        )
        self._last = (an, rels)
        return hist

    def fit_weights(
        self,
        examples: Mapping[str, Mapping[tuple, float]],
        *,
        facts: Mapping[str, Iterable] | None = None,
        semantics: str = "probabilistic",
        learn_rules: bool = True,
        learn_facts: Iterable[str] = (),
        rounds: int | None = None,
        init_rule_weight: float = 0.5,
        optimizer: Any = None,
        epochs: int = 200,
        backend: str = "auto",
        opt_level: int = 2,
        **train_options: Any,
    ) -> Any:
        """Learn rule and fact weights of the rules from examples of derived values.

        Under ``semantics`` ``"probabilistic"`` (noisy-or) or ``"fuzzy"`` (max-product) the
        rules are a differentiable function of their weights: each rule's derivations are
        scaled by a learned weight in (0, 1) (``learn_rules``; starting at
        ``init_rule_weight``) and the facts of the relations in ``learn_facts`` get learned
        weights (starting at their given weights; facts not given stay false). ``examples``
        maps a relation to ``{tuple: target}`` with targets in [0, 1]; the loss is their mean
        cross-entropy. Recursive rules are unrolled for ``rounds`` rounds (default: the
        largest dimension of their relations, enough for a closure over that many constants).
        Each epoch is one step of ``optimizer`` (default ``tl.optim.Adam(lr=0.05)``).

        Afterwards ``program.rule_weights`` maps ``"head (line N)"`` to its weight,
        ``program.fact_weights`` maps each learned relation to ``{tuple: weight}`` and
        ``program.weighted_relations`` holds every relation's dense values under the learned
        weights (over ``symbols``-ordered constants, as ``run`` gives them). Returns the
        training ``History``.
        """
        from ..autodiff import grad
        from ..learn import train
        from ..optim import Adam
        from .weights import WeightedGraph

        if not isinstance(examples, Mapping):
            raise ProgramError(
                "fit_weights: examples must map a relation to {tuple: target}", code="invalid_fact"
            )
        wg = WeightedGraph(
            self.ast.rules,
            facts or {},
            semantics,
            learn_rules,
            learn_facts,
            rounds,
            init_rule_weight,
            Options().memory_budget,
        )
        wg.add_loss(examples)
        wrt = list(wg.g.parameters)
        if not wrt:
            raise ProgramError(
                "fit_weights: nothing to learn (learn_rules=False and no learn_facts)",
                code="invalid_option",
            )
        plan = compile_graph(grad(wg.g, of="loss", wrt=wrt), backend=backend, opt_level=opt_level)
        hist = train(
            plan, [{}], epochs=epochs, optimizer=optimizer or Adam(lr=0.05), **train_options
        )
        self.rule_weights, self.fact_weights, self.weighted_relations = wg.read(plan)
        return hist

    def _initial_params(
        self, params: list[str], init: dict[str, Any], seed: int
    ) -> dict[str, np.ndarray]:
        decl = {d.name: d for d in self.ast.declarations}
        rng = np.random.default_rng(seed)
        unknown = sorted(set(init) - set(params))
        if unknown:
            raise ProgramError(
                f"fit: init {unknown} names no entry of params {params}", code="missing_data"
            )
        out = {}
        for p in params:
            d = decl.get(p)
            if p in init:
                arr = np.asarray(init[p], dtype=d.dtype if d else np.float32)
                if d is not None and d.shape is not None:
                    self._check_shape(d, arr.shape)
            elif p in self.params:
                arr = self.params[p]
            elif d is not None and d.shape is not None and all(isinstance(n, int) for n in d.shape):
                shape = tuple(d.shape)
                arr = (
                    np.zeros(shape)
                    if len(shape) < 2
                    else rng.standard_normal(shape) / np.sqrt(shape[-1])
                ).astype(d.dtype)
            else:
                raise program_error(
                    "missing_data",
                    f"fit: parameter {p!r} needs a starting "
                    "value: give init={...} or declare its shape "
                    f"({p}: float32[...])",
                    d.pos if d else None,
                )
            out[p] = arr
        return out

    @staticmethod
    def _check_shape(d, shape: tuple[int, ...]) -> None:
        ok = len(d.shape) == len(shape) and all(
            isinstance(want, str) or want == got for want, got in zip(d.shape, shape)
        )
        if not ok:
            raise program_error(
                "shape_mismatch",
                f"tensor {d.name!r} is declared with shape "
                f"{list(d.shape)} but the array given has shape {list(shape)}",
                d.pos,
            )

    # ------------------------------------------------------------------ reading results
    def relation(self, name: str, **run_kwargs: Any) -> Relation:
        """``name`` as a Relation (running the program first if it has not run, or if
        ``run_kwargs`` are given); an unknown relation raises ``unknown_predicate``."""
        if self._last is None or run_kwargs:
            self.run(**run_kwargs)
        assert self._last is not None
        an, rels = self._last
        if name not in an.predicates:
            known = ", ".join(an.predicates) or "none"
            raise UnknownPredicateError(
                f"unknown relation {name!r}; the program's relations are: {known}", relation=name
            )
        return rels[name]

    def query(self, relation: str, **run_kwargs: Any) -> set[tuple]:
        """The tuples of ``relation`` as a set (running the program first if it has not run, or
        if ``run_kwargs`` are given); an unknown relation raises ``unknown_predicate``."""
        return self.relation(relation, **run_kwargs).to_set()

    def relations_as_sets(self) -> dict[str, set[tuple]]:
        """Every relation of the last run as a set of tuples (running first if needed)."""
        if self._last is None:
            self.run()
        assert self._last is not None
        return decode_all(*self._last)

    def symbols(self, relation: str) -> list[list]:
        """The constants of each argument position of ``relation``, in index order."""
        if self._last is None:
            self.run()
        assert self._last is not None
        an = self._last[0]
        if relation not in an.predicates:
            raise UnknownPredicateError(f"unknown relation {relation!r}", relation=relation)
        return [
            list(an.domains.values[an.domains.of_position[(relation, i)]])
            for i in range(an.arity.get(relation, 0))
        ]


def parse(text: str, source: str = "<string>") -> Program:
    """Parse program text into a Program (raises ProgramError with line and column)."""
    return Program(parse_ast(text), source)


def load_program(path: str | Path) -> Program:
    """Read and parse a ``.tl`` file."""
    from ..ir.safe_io import read_bounded
    from ..ir.serialize import MAX_FILE_BYTES

    p = Path(path)
    try:
        text = read_bounded(p, MAX_FILE_BYTES, f"program {p.name!r}").decode("utf-8")
    except SerializationError as exc:
        raise ProgramError(f"cannot read program {str(p)!r}: {exc}", code="io_error") from exc
    except UnicodeDecodeError as exc:
        raise ProgramError(
            f"cannot read program {str(p)!r}: not UTF-8 text ({exc.reason} at byte {exc.start})",
            code="io_error",
        ) from exc
    return parse(text, p.name)
