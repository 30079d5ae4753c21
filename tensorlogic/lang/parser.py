"""Parser: program text -> ProgramAST (Datalog rules, tensor equations, declarations).

Statements:

* ``head :- body.`` and ``fact.`` -- Datalog (``head :- a; b.`` is the two rules
  ``head :- a.`` and ``head :- b.``). A bare identifier is a variable whatever its case,
  ``_`` is an anonymous variable, constants are quoted strings or numbers, ``not atom`` (or
  ``!atom``, or Prolog's ``\\+ atom``) is negation, ``X != Y`` etc. are comparisons.
* ``?- atom.`` -- a query, recorded in ``ProgramAST.queries`` (evaluation computes every
  relation, so a query changes nothing; ``program.query(name)`` reads one).
* ``Lhs[i, j] = expr`` / ``Lhs(x, y) = expr`` -- the paper's tensor equations, one per line.
  ``max=`` and ``avg=`` project with max / mean instead of sum. When the left side is a relation
  and the right side is a sum of products of relations only, the equation is a set of Datalog
  rules (``Ancestor(x,z) = Ancestor(x,y) Parent(y,z)``).
* ``W: float32[4, n]`` -- a tensor given as data, its dtype and shape (ints or symbol names).
* Souffle's directives, one per line: ``.decl name(attr: type, ...)`` declares a relation and
  its arity (it exists, empty, even when nothing derives it); ``.input``, ``.output``,
  ``.printsize``, ``.type``, ``.symbol_type``, ``.number_type`` and ``.pragma`` are accepted and
  change nothing (facts come from the ``facts`` argument; every relation is returned).
"""

from __future__ import annotations

from ..errors import ProgramError
from .ast import (
    Arith,
    Atom,
    BinOp,
    Call,
    Comparison,
    Const,
    Declaration,
    Equation,
    Expr,
    Index,
    Literal,
    Neg,
    Number,
    ProgramAST,
    Ref,
    Rule,
    Term,
    Var,
)
from .lexer import Token, parse_error, tokenize

#: nonlinearities of tensor equations and the number of arguments each takes
FUNCTIONS: dict[str, tuple[int, ...]] = {
    "step": (1,),
    "relu": (1,),
    "sig": (1, 2),
    "sigmoid": (1, 2),
    "tanh": (1,),
    "exp": (1,),
    "log": (1,),
    "sqrt": (1,),
    "softplus": (1,),
    "abs": (1,),
    "gelu": (1,),
    "softmax": (1,),
    "log_softmax": (1,),
}
DTYPES = ("float32", "float64", "float16", "bfloat16")
_ARITH_TOKENS = ("+", "-", "*", "/", "%")
_CMP_TOKENS = {"=": "=", "==": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


# Bounds on one equation's expression, so that hostile input cannot exhaust Python's
# recursion limit in the parser or in the passes that walk the expression tree.
MAX_NESTING = 64  # parentheses, function calls and signs inside one another
MAX_OPERATORS = 256  # binary operators in one equation


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.i = 0
        self.anon = 0
        self.depth = 0
        self.operators = 0

    # ------------------------------------------------------------------ helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "EOF":
            self.i += 1
        return t

    def expect(self, kind: str, what: str | None = None) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what or repr(kind)}")
        return self.next()

    def error(self, message: str, tok: Token | None = None) -> ProgramError:
        tok = tok or self.tok
        found = (
            "end of input"
            if tok.kind == "EOF"
            else ("end of line" if tok.kind == "NEWLINE" else repr(tok.text))
        )
        return parse_error(f"{message}, found {found}", tok.pos)

    def skip_newlines(self) -> None:
        while self.tok.kind == "NEWLINE":
            self.next()

    def _continue_if(self, *kinds: str) -> None:
        """Skip new lines when the next real token is one of ``kinds`` (a rule continues)."""
        j = self.i
        while self.toks[j].kind == "NEWLINE":
            j += 1
        if self.toks[j].kind in kinds:
            self.i = j

    def end_of_equation(self) -> None:
        if self.tok.kind in (".", ";"):
            self.next()
        if self.tok.kind not in ("NEWLINE", "EOF"):
            raise self.error("expected the end of the equation (a new line)")

    # ------------------------------------------------------------------ program
    def program(self) -> ProgramAST:
        ast = ProgramAST()
        while True:
            self.skip_newlines()
            if self.tok.kind == "EOF":
                return ast
            self.statement(ast)

    def statement(self, ast: ProgramAST) -> None:
        self.operators = 0
        start = self.tok
        if start.kind == "?-":  # a query: recorded; every relation is computed anyway
            self.next()
            ast.queries.append(self.atom())
            self._continue_if(".")
            if self.tok.kind == ".":
                self.next()
            if self.tok.kind not in ("NEWLINE", "EOF"):
                raise self.error("expected the end of the query")
            return
        if start.kind == "." and self.peek().kind == "IDENT":
            self.directive(ast)
            return
        if start.kind != "IDENT":
            raise self.error("expected a statement (a rule, fact, equation or declaration)")
        nxt = self.peek()
        if nxt.kind == ":":
            ast.declarations.append(self.declaration())
            return
        if nxt.kind == "[" or (nxt.kind == "=" and start.text != "not"):
            ast.equations.append(self.equation(self.tensor_ref()))
            return
        if nxt.kind == "IDENT" and nxt.text in ("max", "avg", "sum") and self.peek(2).kind == "=":
            ast.equations.append(self.equation(self.tensor_ref()))
            return
        head = self.atom()
        self._continue_if(":-", ".")
        if self.tok.kind == ":-":
            self.next()
            bodies = [self.body()]
            while self.tok.kind == ";":  # a disjunction: one rule per alternative (Souffle)
                self.next()
                bodies.append(self.body())
            self.expect(".", "'.' at the end of the rule")
            ast.rules.extend(Rule(head, tuple(body), head.pos) for body in bodies)
            return
        if self.tok.kind == ".":
            self.next()
            ast.rules.append(Rule(head, (), head.pos))
            return
        if self.tok.kind == "=" or (
            self.tok.kind == "IDENT" and self.tok.text in ("max", "avg", "sum")
        ):
            lhs = Ref(head.pred, tuple(self._atom_index(a) for a in head.args), True, head.pos)
            eq = self.equation(lhs)
            rules = _as_rules(eq)
            if rules is None:
                ast.equations.append(eq)
            else:
                ast.rules.extend(rules)
            return
        if self.tok.kind in ("NEWLINE", "EOF") and all(isinstance(a, Const) for a in head.args):
            ast.rules.append(Rule(head, (), head.pos))  # a paper-form fact without a period
            return
        raise self.error("expected '.', ':-' or '=' after the atom")

    def _atom_index(self, t: Term) -> Index:
        if not isinstance(t, Var) or t.anonymous:
            raise parse_error("the left side of an equation takes index names only", t.pos)
        return Index(t.name, False, t.pos)

    # ------------------------------------------------------------------ Datalog
    def atom(self) -> Atom:
        name = self.expect("IDENT", "a predicate name")
        if name.text == "not":
            raise self.error("expected a predicate name", name)
        args: list[Term] = []
        if self.tok.kind == "(":
            self.next()
            if self.tok.kind != ")":
                args.append(self.term())
                while self.tok.kind == ",":
                    self.next()
                    args.append(self.term())
            self.expect(")", "',' or ')' in the argument list")
        return Atom(name.text, tuple(args), name.pos)

    def term(self) -> Term:
        """An additive term: products joined by ``+`` / ``-`` (left-associative)."""
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise self.error(f"term nested more than {MAX_NESTING} levels deep")
            left = self._product_term()
            while self.tok.kind in ("+", "-"):
                op = self._operator()
                left = Arith(op.kind, left, self._product_term(), op.pos)
            return left
        finally:
            self.depth -= 1

    def _product_term(self) -> Term:
        left = self._unary_term()
        while self.tok.kind in ("*", "/", "%"):
            op = self._operator()
            left = Arith(op.kind, left, self._unary_term(), op.pos)
        return left

    def _unary_term(self) -> Term:
        t = self.tok
        if t.kind == "-" and self.peek().kind != "NUMBER":
            self.next()
            return Arith("-", Const(0, t.pos), self._unary_term(), t.pos)
        if t.kind == "(":
            self.next()
            inner = self.term()
            self.expect(")", "')' closing the term")
            return inner
        return self.simple_term()

    def simple_term(self) -> Term:
        t = self.tok
        if t.kind == "IDENT":
            self.next()
            if t.text == "_":
                self.anon += 1
                return Var(f"_{self.anon}", t.pos, anonymous=True)
            return Var(t.text, t.pos)
        if t.kind in ("STRING", "NUMBER"):
            self.next()
            return Const(t.value, t.pos)  # type: ignore[arg-type]
        if t.kind == "-" and self.peek().kind == "NUMBER":
            self.next()
            return Const(-self.next().value, t.pos)  # type: ignore[operator]
        raise self.error("expected a variable, a quoted string or a number")

    def body(self) -> list:
        # a Datalog rule runs to its '.', over as many lines as it likes
        self.skip_newlines()
        items = [self.body_item()]
        self.skip_newlines()
        while self.tok.kind == ",":
            self.next()
            self.skip_newlines()
            items.append(self.body_item())
            self.skip_newlines()
        return items

    def body_item(self):
        t = self.tok
        if t.kind == "IDENT" and t.text == "not" and self.peek().kind == "IDENT":
            self.next()
            return Literal(self.atom(), True)
        if t.kind in ("!", "\\+") and self.peek().kind == "IDENT":
            self.next()
            return Literal(self.atom(), True)
        if (
            t.kind == "IDENT"
            and self.peek().kind not in _CMP_TOKENS
            and self.peek().kind not in _ARITH_TOKENS
        ):
            return Literal(self.atom(), False)
        left = self.term()
        op = self.tok
        if op.kind not in _CMP_TOKENS:
            raise self.error("expected a comparison operator (=, !=, <, <=, >, >=)")
        self.next()
        right = self.term()
        return Comparison(_CMP_TOKENS[op.kind], left, right, op.pos)

    # ------------------------------------------------------------------ Souffle directives
    def directive(self, ast: ProgramAST) -> None:
        self.next()  # the dot
        name = self.next()
        if name.text == "decl":
            rel = self.expect("IDENT", "a relation name")
            self.expect("(", "'(' and the relation's attributes")
            arity = 0
            while self.tok.kind != ")":
                if arity:
                    self.expect(",", "',' or ')' in the attribute list")
                self.expect("IDENT", "an attribute name")
                self.expect(":", "':' and the attribute's type")
                self.expect("IDENT", "a type name")
                arity += 1
            self.next()
            while self.tok.kind == "IDENT":  # qualifiers: btree, brie, inline, ...
                q = self.next()
                if q.text == "eqrel":
                    raise parse_error(
                        "the eqrel qualifier (an equivalence relation) is not supported; "
                        "write its reflexive, symmetric and transitive rules instead",
                        q.pos,
                    )
            if rel.text in ast.relations:
                raise parse_error(f"relation {rel.text!r} is declared twice", rel.pos)
            ast.relations[rel.text] = arity
        elif name.text in ("input", "output", "printsize", "limitsize"):
            depth = 0  # names, and any (key=value, ...) parameters: nothing to do with them
            while self.tok.kind not in ("NEWLINE", "EOF") and (depth or self.tok.kind != "."):
                depth += {"(": 1, ")": -1}.get(self.tok.kind, 0)
                self.next()
        elif name.text in ("type", "symbol_type", "number_type", "pragma"):
            while self.tok.kind not in ("NEWLINE", "EOF"):
                self.next()
        else:
            raise parse_error(
                f"unsupported directive .{name.text}; expected .decl, .input, .output, "
                ".printsize, .type or .pragma",
                name.pos,
            )
        if self.tok.kind not in ("NEWLINE", "EOF"):
            raise self.error(f"expected the end of the .{name.text} directive (a new line)")

    # ------------------------------------------------------------------ declarations
    def declaration(self) -> Declaration:
        name = self.next()
        self.expect(":")
        dtype = "float32"
        if self.tok.kind == "IDENT":
            dt = self.next()
            if dt.text not in DTYPES:
                raise parse_error(f"unknown dtype {dt.text!r}; expected one of {DTYPES}", dt.pos)
            dtype = dt.text
        shape: tuple | None = None
        if self.tok.kind == "[":
            self.next()
            dims: list[int | str] = []
            while self.tok.kind != "]":
                if dims:
                    self.expect(",", "',' or ']'")
                d = self.tok
                if d.kind == "NUMBER" and isinstance(d.value, int):
                    dims.append(d.value)
                elif d.kind == "IDENT":
                    dims.append(d.text)
                else:
                    raise self.error("expected a dimension (an integer or a symbol name)")
                self.next()
            self.next()
            shape = tuple(dims)
        self.end_of_equation()
        return Declaration(name.text, dtype, shape, name.pos)

    # ------------------------------------------------------------------ equations
    def tensor_ref(self) -> Ref:
        name = self.expect("IDENT", "a tensor name")
        if self.tok.kind != "[":
            return Ref(name.text, (), False, name.pos)
        self.next()
        idx: list[Index] = []
        while self.tok.kind != "]":
            if idx:
                self.expect(",", "',' or ']' in the index list")
            t = self.expect("IDENT", "an index name")
            marked = False
            if self.tok.kind == ".":
                self.next()
                marked = True
            idx.append(Index(t.text, marked, t.pos))
        self.next()
        return Ref(name.text, tuple(idx), False, name.pos)

    def equation(self, lhs: Ref) -> Equation:
        projection = "sum"
        if self.tok.kind == "IDENT" and self.tok.text in ("max", "avg", "sum"):
            projection = self.next().text
        self.expect("=", "'=' after the left side of the equation")
        self.operators = 0
        expr = self.expr()
        self.end_of_equation()
        return Equation(lhs, expr, projection, lhs.pos)

    def expr(self) -> Expr:
        if self.tok.kind == "-":
            t = self.next()
            left: Expr = Neg(self.product(), t.pos)
        else:
            left = self.product()
        while self.tok.kind in ("+", "-"):
            op = self._operator()
            left = BinOp(op.kind, left, self.product(), op.pos)
        return left

    def _operator(self, consume: bool = True) -> Token:
        self.operators += 1
        if self.operators > MAX_OPERATORS:
            raise self.error(f"expression has more than {MAX_OPERATORS} operators")
        return self.next() if consume else self.tok

    def _starts_factor(self) -> bool:
        t = self.tok
        return t.kind in ("NUMBER", "(") or (t.kind == "IDENT" and t.text != "not")

    def product(self) -> Expr:
        left = self.factor()
        while True:
            if self.tok.kind in ("*", "/"):
                op = self._operator()
                left = BinOp(op.kind, left, self.factor(), op.pos)
            elif self._starts_factor():
                pos = self._operator(consume=False).pos
                left = BinOp("*", left, self.factor(), pos)
            else:
                return left

    def factor(self) -> Expr:
        # a bound on nesting keeps hostile input from exhausting Python's recursion limit
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise self.error(f"expression nested more than {MAX_NESTING} levels deep")
            return self._factor()
        finally:
            self.depth -= 1

    def _factor(self) -> Expr:
        t = self.tok
        if t.kind == "-":
            self.next()
            return Neg(self.factor(), t.pos)
        if t.kind == "NUMBER":
            self.next()
            return Number(float(t.value), t.pos)  # type: ignore[arg-type]
        if t.kind == "(":
            self.next()
            e = self.expr()
            self.expect(")", "')'")
            return e
        if t.kind != "IDENT":
            raise self.error("expected a tensor, a number, a function or '('")
        if t.text in FUNCTIONS and self.peek().kind == "(":
            self.next()
            self.next()
            args = [self.expr()]
            while self.tok.kind == ",":
                self.next()
                args.append(self.expr())
            self.expect(")", "',' or ')' after the function argument")
            if len(args) not in FUNCTIONS[t.text]:
                raise parse_error(
                    f"{t.text}() takes {' or '.join(map(str, FUNCTIONS[t.text]))} "
                    f"argument(s), got {len(args)}",
                    t.pos,
                )
            return Call(t.text, tuple(args), t.pos)
        if self.peek().kind == "(":
            a = self.atom()
            return Ref(a.pred, tuple(self._atom_index(x) for x in a.args), True, a.pos)
        return self.tensor_ref()


def _products(e: Expr) -> list[list[Expr]] | None:
    """The expression as a sum of products of factors, or None if it is not one."""
    if isinstance(e, BinOp) and e.op == "+":
        left, right = _products(e.left), _products(e.right)
        return None if left is None or right is None else left + right
    if isinstance(e, BinOp) and e.op == "*":
        left, right = _products(e.left), _products(e.right)
        if left is None or right is None or len(left) != 1 or len(right) != 1:
            return None
        return [left[0] + right[0]]
    return [[e]]


def _as_rules(eq: Equation) -> list[Rule] | None:
    """A paper-form Boolean equation over relations only, as Datalog rules (else None)."""
    if eq.projection != "sum":
        return None
    terms = _products(eq.expr)
    if terms is None or not all(isinstance(f, Ref) and f.relation for t in terms for f in t):
        return None
    head = Atom(eq.lhs.name, tuple(Var(i.name, i.pos) for i in eq.lhs.indices), eq.lhs.pos)
    rules = []
    for term in terms:
        body = tuple(
            Literal(Atom(f.name, tuple(Var(i.name, i.pos) for i in f.indices), f.pos))
            for f in term  # type: ignore[union-attr]
        )
        rules.append(Rule(head, body, eq.pos))
    return rules


def parse_ast(text: str) -> ProgramAST:
    """Parse program text into a ProgramAST; raises ProgramError(parse_error) with a position."""
    if not isinstance(text, str):
        raise ProgramError(
            f"program text must be a str, got {type(text).__name__}", code="parse_error"
        )
    return _Parser(text).program()


def parse_datalog(text: str) -> tuple[list[Rule], dict[str, int]]:
    """Parse Datalog-only text: its rules and its ``.decl`` relations (name -> arity); tensor
    equations or declarations are a parse error."""
    ast = parse_ast(text)
    if ast.equations or ast.declarations:
        pos = (ast.equations or ast.declarations)[0].pos
        raise parse_error("expected Datalog rules and facts only, not tensor equations", pos)
    return ast.rules, ast.relations


def parse_rules(text: str) -> list[Rule]:
    """Parse Datalog-only text to its rules (see ``parse_datalog`` for declarations too)."""
    return parse_datalog(text)[0]


__all__ = ["FUNCTIONS", "parse_ast", "parse_datalog", "parse_rules"]
