"""Random specs built as expression trees (bench/oracle_eval.py), so each spec's text and its oracle come from
the same tree: row-wise math over [T, H] and FFN blocks whose combine and epilogue are such math."""

from __future__ import annotations

import random
from dataclasses import dataclass

from oracle_eval import BINARY, Node

#: literals: signs, the f32 edges (tiny, subnormal, huge), f16's edge
LITERALS = (2.0, 0.5, -1.0, -2.0, 3.0, -0.125, 1e-06, 0.001, 1e-30, -1e-30, 1e-40, 1e30, -1e30, 3e38,
            -3e38, 127.0, 65504.0, 70000.0)  # fmt: skip
SAFE = (2.0, 0.5, -1.0, -2.0, 3.0, -0.125, 0.001)
ACTS = ("silu", "gelu", "gelu_tanh", "relu", "sigmoid", "tanh", "exp", "square", "abs")
UNARY_ROW = ("exp", "log", "sqrt", "rsqrt", "abs", "square", "relu", "sigmoid", "tanh", "silu", "gelu",
             "gelu_tanh", "sign", "neg")  # fmt: skip
NEEDS = {"log": "pos", "rsqrt": "pos", "sqrt": "nonneg"}
GIVES = {"exp": "pos", "sigmoid": "pos", "rsqrt": "pos", "abs": "nonneg", "square": "nonneg",
         "relu": "nonneg", "sqrt": "nonneg"}  # fmt: skip
ORDER = {"pos": 2, "nonneg": 1, "any": 0}


@dataclass(frozen=True)
class Output:
    """A declared output: its name, dtype, declared shape text and oracle node (a [T, 1] node for [T])."""

    name: str
    dtype: str
    shape: str
    node: Node


@dataclass(frozen=True)
class OracleCase:
    """A spec and what the oracle needs to run its kernel: inputs (name, dtype, scale), shapes, params to
    pass, dims, outputs."""

    text: str
    inputs: tuple[tuple[str, str, str], ...]
    shapes: dict[str, tuple[int, ...]]
    params: dict[str, float]
    dims: dict[str, int]
    outputs: tuple[Output, ...]
    lnc: int = 1  # logical cores the kernel runs on
    target: str = "trn2"  # the machine the host function plans for
    layouts: tuple[tuple[str, str], ...] = ()  # (input, how it is laid out: bench/oracle_layout.py)
    generator: str = ""  # the function that made it
    grads: bool = False  # also check the op's gradients (bench/oracle_grad.py)


#: each kind's shape over the axes tokens, heads, width ([T, H] specs are [T, 1, H] with one head)
SHAPES = {"row": "TGH", "row1": "T1H", "col": "TG1", "col1": "T11", "vec": "H", "gvec": "GH", "scalar": ""}
KINDS = {shape: kind for kind, shape in SHAPES.items()}


def _kind(a: str, b: str) -> str:
    """The kind of `a op b`: NumPy broadcasting of their shapes."""
    sa, sb = SHAPES[a].rjust(3, "1"), SHAPES[b].rjust(3, "1")
    shape = "".join(y if x == "1" else x for x, y in zip(sa, sb, strict=True))
    return KINDS.get(shape) or KINDS[shape.lstrip("1")]


def lit(value: float) -> Node:
    """A number as the spec writes it (negative in parentheses)."""
    text = repr(value) if value >= 0 else f"({value!r})"
    return Node(
        "lit", (), text, "scalar", "pos" if value > 1e-30 else "nonneg" if value >= 0 else "any", value
    )


def un(name: str, a: Node) -> Node:
    """A unary function; `neg` prints as `-a`."""
    text = f"(-{a.text})" if name == "neg" else f"{name}({a.text})"
    sign = GIVES.get(name, "any")
    if name in ("abs", "square", "exp", "sqrt") and a.sign == "pos":
        sign = "pos"
    return Node(name, (a,), text, a.kind, sign)


def bi(name: str, a: Node, b: Node) -> Node:
    """A binary op, broadcasting."""
    sym = BINARY[name]
    text = f"{sym}({a.text}, {b.text})" if sym.isalpha() else f"({a.text} {sym} {b.text})"
    low = min(ORDER[a.sign], ORDER[b.sign])
    if name in ("mul", "div"):
        sign = "pos" if low == 2 else "nonneg" if low == 1 and name == "mul" else "any"
    elif name == "add":
        sign = "pos" if low >= 1 and max(ORDER[a.sign], ORDER[b.sign]) == 2 else ("nonneg" if low else "any")
    elif name == "maximum":
        sign = {2: "pos", 1: "nonneg", 0: "any"}[max(ORDER[a.sign], ORDER[b.sign])]
    else:
        sign = "any" if name == "sub" else {2: "pos", 1: "nonneg", 0: "any"}[low]
    return Node(name, (a, b), text, _kind(a.kind, b.kind), sign)


def power(a: Node, e: float) -> Node:
    """`a ** e` (a constant exponent)."""
    sign = "pos" if a.sign == "pos" else ("nonneg" if e == 2 or a.sign == "nonneg" else "any")
    return Node("pow", (a,), f"({a.text} ** {e!r})", a.kind, sign, e)


def reduce(name: str, a: Node, keepdim: bool, lead: int = 1) -> Node:
    """A reduction over the last axis: `[T, 1]` (`keepdim=false` written back with `[:, None]`, or
    `[:, :, None]` past `lead` = 2 leading axes)."""
    back = "[" + ":, " * lead + "None]"
    text = f"{name}({a.text}, axis=-1, keepdim=true)" if keepdim else f"{name}({a.text}, axis=-1){back}"
    return Node(name, (a,), text, "col1" if a.kind in ("row1", "col1") else "col", a.sign)


def cast(dtype: str, a: Node) -> Node:
    """A cast (a cast to f16 may flush a tiny value to 0)."""
    sign = "nonneg" if dtype == "f16" and a.sign == "pos" else a.sign
    return Node("cast", (a,), f"{dtype}({a.text})", a.kind, sign, dtype)


def named(name: str, node: Node) -> Node:
    """A statement's value, referred to by name."""
    return Node("ref", (node,), name, node.kind, node.sign)


class Gen:
    """Random expressions over a pool of named row/col values, [H] vectors and scalars."""

    def __init__(self, rng: random.Random, values: list[Node], vectors: list[Node], scalars: list[Node],
                 eps: Node, elementwise: bool = False, lead: int = 1) -> None:  # fmt: skip
        self.rng, self.values, self.vectors, self.scalars, self.eps = rng, values, vectors, scalars, eps
        self.elementwise = elementwise  # an FFN combine: no reductions, no norms
        self.lead = lead  # leading axes: 1 over [T, H], 2 over [T, G, H]
        self.affine = [v for v in vectors if v.kind == "vec"]  # norm weights are [H]

    def scalar(self) -> Node:
        """A param, a literal, or a constant expression of one (`square(-2.0)`, `-2.0 ** 2`)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.3 and self.scalars:
            return rng.choice(self.scalars)
        if roll < 0.85:
            return lit(rng.choice(LITERALS if rng.random() < 0.5 else SAFE))
        value = rng.choice(SAFE)
        k, mag = lit(value), lit(abs(value))
        forms = [
            lambda: un(rng.choice(("square", "exp", "abs", "neg", "tanh")), k),
            lambda: Node(
                "neg", (power(mag, 2.0),), f"(-{abs(value)!r} ** 2.0)", "scalar"
            ),  # Python's -a ** 2
            lambda: power(k, 2.0),
            lambda: power(mag, -1.0),
        ]
        return rng.choice(forms)()

    def operand(self) -> Node:
        """Anything to combine with a value."""
        roll = self.rng.random()
        if roll < 0.45:
            return self.rng.choice(self.values)
        if roll < 0.65 and self.vectors:
            v = self.rng.choice(self.vectors)
            return bi("add", lit(1.0), v) if self.rng.random() < 0.2 else v
        return self.scalar()

    def positive(self, a: Node) -> Node:
        """`a` made positive where a function needs it (log, rsqrt) or non-negative (sqrt)."""
        form = self.rng.choice(["exp", "abs", "square", "sigmoid"])
        if form == "exp":
            return un("exp", a)
        if form == "sigmoid":
            return un("sigmoid", a)
        return bi("add", un(form, a), self.eps if self.rng.random() < 0.5 else lit(0.001))

    def expr(self, depth: int) -> Node:
        """A row or column value."""
        rng = self.rng
        base = self.expr(depth - 1) if depth > 0 and rng.random() < 0.5 else rng.choice(self.values)
        forms = ["unary", "unary", "binary", "binary", "binary", "pow", "clamp", "where", "cast"]
        if not self.elementwise:
            forms += ["reduce", "reduce", "norm", "softmax", "rstd", "lse"]
        form = rng.choice(forms)
        if form == "unary":
            f = rng.choice(UNARY_ROW)
            need = NEEDS.get(f)
            ok = need is None or ORDER[base.sign] >= ORDER[need]
            return un(f, base if ok else self.positive(base))
        if form == "binary":
            op = rng.choice(list(BINARY))
            other = self.operand() if rng.random() < 0.8 else self.expr(depth - 1) if depth > 0 else base
            if op == "div" and other.sign != "pos":
                other = self.positive(other)
            return bi(op, base, other) if rng.random() < 0.7 or op == "div" else bi(op, other, base)
        if form == "pow":
            e = rng.choice([2.0, 3.0, -1.0, 0.5, -0.5])
            need = "pos" if e < 0 else "nonneg" if e == 0.5 else None
            ok = need is None or ORDER[base.sign] >= ORDER[need]
            return power(base if ok else self.positive(base), e)
        if form == "clamp":
            lo, hi = sorted(rng.sample(SAFE, 2))
            bounds = (lo, hi) if rng.random() < 0.5 else (lo, None) if rng.random() < 0.5 else (None, hi)
            words = [f"{k}={v!r}" for k, v in zip(("min", "max"), bounds, strict=True) if v is not None]
            sign = "pos" if bounds[0] is not None and bounds[0] > 0 else "any"
            return Node("clamp", (base,), f"clamp({base.text}, {', '.join(words)})", base.kind, sign, bounds)
        if form == "where":
            limit = self.scalar() if rng.random() < 0.6 else rng.choice(self.values)
            a, b = base, self.operand()
            text = f"where({base.text} > {limit.text}, {a.text}, {b.text})"
            return Node("where", (base, limit, a, b), text, _kind(_kind(base.kind, limit.kind), b.kind))
        if form == "cast":
            return cast(rng.choice(["bf16", "bf16", "f16", "f32"]), base)
        return self._row_form(form, base if base.kind in ("row", "row1") else rng.choice(self._rows()))

    def _rows(self) -> list[Node]:
        return [v for v in self.values if v.kind in ("row", "row1")]

    def _row_form(self, form: str, row: Node) -> Node:
        """Forms that reduce a row: a statistic, a norm, a softmax, a log-sum-exp."""
        rng = self.rng
        if form == "reduce":
            return reduce(rng.choice(["sum", "mean", "max"]), row, rng.random() < 0.7, self.lead)
        if form == "norm":
            weights = self.affine[: rng.randint(0, len(self.affine))]
            name = rng.choice(["rmsnorm", "layernorm"])
            weights = weights[:1] if name == "rmsnorm" else weights[:2]
            text = f"{name}({', '.join(a.text for a in (row, self.eps, *weights))})"
            return Node(name, (row, self.eps, *weights), text, row.kind)
        if form == "rstd":
            return un("rsqrt", bi("add", reduce("mean", un("square", row), True), self.eps))
        top = reduce("max", row, rng.random() < 0.7, self.lead)
        e = un("exp", bi("sub", row, top))
        if form == "softmax":
            return bi("div", e, reduce("sum", e, True))
        return bi("add", top, un("log", reduce("sum", e, rng.random() < 0.5, self.lead)))


# ---- whole specs ----------------------------------------------------------------------------------------

#: widths: a PSUM bank (512 f32) and all eight (4096), SBUF row limits (wide rows stream), ragged ones
WIDTHS = (128, 256, 384, 512, 520, 1000, 1280, 2048, 4095, 4096, 4100, 8192, 12288, 16384, 24576, 32768,
          50000, 65536)  # fmt: skip
TOKENS = (1, 3, 100, 127, 128, 129, 300, 1000)
MAX_ELEMENTS = 1_500_000  # per [T, H] tensor: the interpreter's time


def _params(rng: random.Random) -> tuple[list[str], dict[str, float], Node, list[Node]]:
    """Declarations of eps and p, the values passed for them, and their nodes."""
    eps_default = rng.choice([1e-6, 1e-5, 0.1])
    p_default = rng.choice(LITERALS)
    passed = {"eps": rng.choice([1e-6, 0.5]) if rng.random() < 0.3 else eps_default,
              "p": rng.choice(LITERALS) if rng.random() < 0.3 else p_default}  # fmt: skip
    lines = [f"param eps = {eps_default!r}", f"param p = {p_default!r}"]
    eps = Node("param", (), "eps", "scalar", "pos", "eps")
    p = Node("param", (), "p", "scalar", "pos" if passed["p"] > 1e-30 else "any", "p")
    return lines, passed, eps, [eps, p]


def _statements(gen: Gen, count: int, prefix: str) -> list[str]:
    """`count` statements, each a new named value in the generator's pool."""
    lines = []
    for i in range(count):
        node = gen.expr(gen.rng.randint(0, 3))
        name = f"{prefix}{i}"
        lines.append(f"{name} = {node.text}")
        gen.values.append(named(name, node))
    return lines


def reads(node: Node, leaf: Node) -> bool:
    """Whether `node`'s value depends on `leaf`."""
    return node is leaf or any(reads(a, leaf) for a in node.args)


OUT_DTYPES = ("bf16", "f16", "f32")
CASTS = ("bf16", "f16", "f32")  # dtypes the spec can cast to; fp8 only as an output's stored dtype
#: an FFN epilogue may also store fp8 (docs/spec-language.md): e5m2, as trn1 and trn2 take no OCP e4m3
#: (fusegen/codegen/fp8.py); e5m2 twice keeps each seed's draws
FFN_OUT_DTYPES = (*OUT_DTYPES, "fp8_e5m2", "fp8_e5m2")
FP8 = ("fp8_e4m3", "fp8_e5m2")
#: fp8 weights feed the Tensor engine, which takes e4m3 (OCP) from NeuronCore-v4 only
#: (fusegen/codegen/fp8.py); e5m2 twice keeps each seed's draws
WEIGHT_FP8 = ("fp8_e5m2", "fp8_e5m2")


def _outputs(rng: random.Random, values: list[Node], rows: str, width: str, count: int, per_row: bool = True,
             lead: int = 1, dtypes: tuple[str, ...] = OUT_DTYPES
             ) -> tuple[list[str], list[Output]]:  # fmt: skip
    """Declarations and statements of `count` outputs of the last values, in random dtypes and forms, the
    first a full-width one where there is one (the families want one); `per_row`: [T] outputs too, which
    are the only per-row form past `lead` = 2 leading axes ([T, G])."""
    last = [v for v in values if v.kind in ("row", "col")][-3:]
    picked = rng.sample(last, k=min(count, len(last)))
    wide = [v for v in reversed(values) if v.kind == "row"]
    if wide and not any(v.kind == "row" for v in picked):
        picked[0] = wide[0]
    decls, outputs = [], []
    for j, value in enumerate(picked):
        dtype, name = rng.choice(dtypes), f"o{j}"
        node = cast(dtype, value) if rng.random() < 0.5 and dtype in CASTS else value
        expr, shape = node.text, f"{rows}, {width}" if value.kind == "row" else f"{rows}, 1"
        if value.kind == "col" and per_row and (lead > 1 or rng.random() < 0.5):
            expr, shape = f"{node.text}[{':, ' * lead}0]", rows
        decls.append(f"output {name}: {dtype}[{shape}]")
        outputs.append((f"{name} = {expr}", Output(name, dtype, shape, node)))
    return decls + [s for s, _ in outputs], [o for _, o in outputs]


def finite_mark(finite: bool) -> str:
    """` finite` on an input line whose rows a case declares finite (the fuzzer's inputs are): some cases
    (by the parity of T + H), so the row kernels' Tensor-engine staging (finite rows only) is fuzzed too."""
    return " finite" if finite else ""


def rows_case(rng: random.Random) -> OracleCase:
    """Row-wise math over [T, H]."""
    h = rng.choice(WIDTHS)
    t = rng.choice([t for t in TOKENS if t * h <= MAX_ELEMENTS] or [1])
    head = ["kernel k", "dim T, H"] + (
        ["require H % 128 == 0"] if h % 128 == 0 and rng.random() < 0.5 else []
    )
    data = ["x"] + (["r"] if rng.random() < 0.5 else [])
    vectors = ["w", "b"][: rng.randint(0, 2)]
    dtypes = {n: rng.choice(["bf16", "f32", "f16"]) for n in data + vectors}
    finite = finite_mark((t + h) % 2 == 0)
    head += [f"input {n}: {dtypes[n]}[T, H]{finite}" for n in data]
    head += [f"input {n}: {dtypes[n]}[H]" for n in vectors]
    plines, passed, eps, scalars = _params(rng)
    kind = {n: ("row" if n in data else "vec") for n in data + vectors}
    leaves = {n: Node("in", (), n, kind[n], "any", n) for n in kind}
    gen = Gen(rng, [leaves[n] for n in data], [leaves[n] for n in vectors], scalars, eps)
    body = _statements(gen, rng.randint(1, 6), "v")
    if all(v.kind != "row" for v in gen.values[len(data) :]):  # statistics alone: broadcast one back
        row = bi("mul", leaves["x"], gen.values[-1])
        body.append(f"v{len(body)} = {row.text}")
        gen.values.append(named(f"v{len(body) - 1}", row))
    decls, outputs = _outputs(rng, gen.values[len(data) :], "T", "H", rng.randint(1, 3))
    out_decls, out_lines = decls[: len(outputs)], decls[len(outputs) :]
    text = "\n".join(head + plines + out_decls + body + out_lines + [f"check T={t} H={h}"]) + "\n"
    inputs = tuple((n, dtypes[n], "unit") for n in data + vectors)
    shapes: dict[str, tuple[int, ...]] = {n: (t, h) if kind[n] == "row" else (h,) for n in kind}
    return OracleCase(text, inputs, shapes, passed, {"T": t, "H": h}, tuple(outputs), rng.choice([1, 2]))


def _scaled(product: Node, scale: Node | None) -> Node:
    """`(x @ w) * s` for an fp8 weight with per-channel scales `s`, else the product."""
    return product if scale is None else bi("mul", product, scale)


def ffn_case(rng: random.Random) -> OracleCase:
    """An FFN block: projections, a combine, `bf16(h) @ w2t`, an epilogue of row math over it."""
    r, k, i = rng.choice([1, 7, 130, 300]), rng.choice([128, 384, 1280]), rng.choice([128, 1000, 3416])
    gated, bias = rng.random() < 0.5, rng.random() < 0.4
    wdt = rng.choice(("bf16", "bf16", *WEIGHT_FP8))  # fp8 weights: each product times its per-channel scale
    scales = {"w1t": "s1", "wgt": "sg", "w2t": "s2"} if wdt in FP8 else {}
    names = ["x", "w1t"] + (["wgt"] if gated else []) + (["b1"] if bias else []) + ["w2t", "a", "g"]
    names += [scales[w] for w in names if w in scales]
    shapes = {"x": (r, k), "w1t": (k, i), "wgt": (k, i), "b1": (i,), "w2t": (i, k), "a": (r, k), "g": (k,),
              "s1": (i,), "sg": (i,), "s2": (k,)}  # fmt: skip
    decl = {"x": "bf16[R, K]", "w1t": f"{wdt}[K, I]", "wgt": f"{wdt}[K, I]", "b1": "f32[I]",
            "w2t": f"{wdt}[I, K]", "a": "f32[R, K]", "g": "f32[K]", "s1": "f32[I]", "sg": "f32[I]",
            "s2": "f32[K]"}  # fmt: skip
    leaf = {n: Node("in", (), n, "row" if n in "xa" else "vec", "any", n) for n in names}
    scale = lambda w: leaf.get(scales.get(w, ""))  # noqa: E731
    mm = lambda w, a=leaf["x"]: _scaled(Node("mm", (a, leaf[w]), f"({a.text} @ {w})", "row"), scale(w))  # noqa: E731
    up = bi("add", mm("w1t"), leaf["b1"]) if bias else mm("w1t")
    plines, passed, eps, scalars = _params(rng)
    u = named("u", up)
    combine = Gen(rng, [u], [], scalars, eps, True)  # elementwise math of u; a gate multiplies it by v
    h = un(rng.choice(ACTS), u) if rng.random() < 0.6 else combine.expr(1)
    h = bi("mul", h, named("v", mm("wgt"))) if gated else h
    d = named("d", mm("w2t", cast("bf16", named("h", h))))
    epi = Gen(rng, [d], [leaf["g"]], scalars, eps)  # the first epilogue statement reads d
    body = [f"u = {up.text}"] + ([f"v = {mm('wgt').text}"] if gated else [])
    body += [f"h = {h.text}", f"d = {d.args[0].text}", *_statements(epi, 1, "e")]
    epi.values.append(leaf["a"])
    body += _statements(epi, rng.randint(0, 2), "f")
    stored = [val for val in epi.values if reads(val, d)]
    decls, outputs = _outputs(rng, stored, "R", "K", rng.randint(1, 2), False, 1, FFN_OUT_DTYPES)
    out_decls, out_lines = decls[: len(outputs)], decls[len(outputs) :]
    head = ["kernel k", "dim R, K, I", "require K % 128 == 0"] + [f"input {n}: {decl[n]}" for n in names]
    text = "\n".join(head + plines + out_decls + body + out_lines + [f"check R={r} K={k} I={i}"]) + "\n"
    fan_in = {"w1t": "fan_in", "wgt": "fan_in", "w2t": "fan_in"}
    inputs = tuple((n, decl[n].split("[")[0], fan_in.get(n, "unit")) for n in names)
    return OracleCase(text, inputs, {n: shapes[n] for n in names}, passed, {"R": r, "K": k, "I": i},
                      tuple(outputs), rng.choice([1, 2]))  # fmt: skip
