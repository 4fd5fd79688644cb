"""More oracle cases (bench/oracle_gen.py's trees): row math over [T, G, H] with a heads axis, and the
projection family's matmuls of one operand with an elementwise epilogue each."""

from __future__ import annotations

import random

from oracle_eval import Node
from oracle_gen import (
    ACTS,
    CASTS,
    FFN_OUT_DTYPES,
    FP8,
    MAX_ELEMENTS,
    TOKENS,
    WEIGHT_FP8,
    Gen,
    OracleCase,
    Output,
    _outputs,
    _params,
    _statements,
    bi,
    cast,
    finite_mark,
    named,
    power,
    reads,
    un,
)

HEADS = (1, 2, 3, 4, 8)
#: head widths: qk_norm's 128, engram's 2048 / 7168, PSUM-bank edges and ragged ones, one that streams
HEAD_WIDTHS = (32, 128, 256, 520, 1000, 2048, 4096, 7168, 16384)
DTYPE_NAMES = ("bf16", "f32", "f16")


def _leaf(name: str, kind: str) -> Node:
    return Node("in", (), name, kind, "any", name)


def _decls(names: list[str], dtypes: dict[str, str], shapes: dict[str, str], finite: bool) -> list[str]:
    """Input lines; with `finite`, the rows (`[T, ...]` inputs) declared finite (no extra random draw)."""
    return [f"input {n}: {dtypes[n]}[{shapes[n]}]{finite_mark(finite and shapes[n].startswith('T'))}"
            for n in names]  # fmt: skip



def heads_case(rng: random.Random) -> OracleCase:
    """Row math over [T, G, H]: data, packed `kv` read as key heads and one shared value row, a [T, G]
    column input, [H] and [G, H] weights, the width as a value (`H ** -0.5`)."""
    g, h = rng.choice(HEADS), rng.choice(HEAD_WIDTHS)
    t = rng.choice([t for t in TOKENS if t * (g + 1) * h <= MAX_ELEMENTS] or [1])
    names = ["x"] + [n for n, p in (("r", 0.3), ("kv", 0.4), ("c", 0.3), ("w", 0.5), ("wg", 0.4))
                     if rng.random() < p]  # fmt: skip
    decl = {"x": "T, G, H", "r": "T, G, H", "kv": "T, G + 1, H", "c": "T, G", "w": "H", "wg": "G, H"}
    sizes = {"x": (t, g, h), "r": (t, g, h), "kv": (t, g + 1, h), "c": (t, g), "w": (h,), "wg": (g, h)}
    dtypes = {n: rng.choice(DTYPE_NAMES) for n in names}
    require = ["require H % 128 == 0"] if h % 128 == 0 and rng.random() < 0.5 else []
    head = ["kernel k", "dim T, G, H", *require]
    plines, passed, eps, scalars = _params(rng)
    width = Node("param", (), "H", "scalar", "pos", "H")
    scalars += [power(width, -0.5), width]
    leaves = {n: _leaf(n, {"w": "vec", "wg": "gvec"}.get(n, "row")) for n in names}
    values, body = [leaves[n] for n in ("x", "r") if n in names], []
    if "kv" in names:  # engram's packing: G key heads, then one value row shared by every head
        kh = Node("slice", (leaves["kv"],), "kv[:, 0:G, :]", "row", "any", (1, 0, g))
        vh = Node("slice", (leaves["kv"],), "kv[:, G:G + 1, :]", "row1", "any", (1, g, g + 1))
        body += [f"kh = {kh.text}", f"vh = {vh.text}"]
        values += [named("kh", kh), named("vh", vh)]
    if "c" in names:
        values.append(Node("unsq", (leaves["c"],), "c[:, :, None]", "col", "any"))
    data = len(values)
    gen = Gen(rng, values, [leaves[n] for n in ("w", "wg") if n in names], scalars, eps, lead=2)
    body += _statements(gen, rng.randint(1, 6), "s")
    if all(val.kind != "row" for val in gen.values[data:]):  # no [T, G, H] value yet: broadcast one back
        row = bi("mul", leaves["x"], gen.values[-1])
        body.append(f"s{len(body)} = {row.text}")
        gen.values.append(named(f"s{len(body) - 1}", row))
    decls, outputs = _outputs(rng, gen.values[data:], "T, G", "H", rng.randint(1, 3), lead=2)
    out_decls, out_lines = decls[: len(outputs)], decls[len(outputs) :]
    finite = (t + h) % 2 == 0
    text = "\n".join(head + _decls(names, dtypes, decl, finite) + plines + out_decls + body + out_lines
                     + [f"check T={t} G={g} H={h}"]) + "\n"  # fmt: skip
    inputs = tuple((n, dtypes[n], "unit") for n in names)
    return OracleCase(text, inputs, {n: sizes[n] for n in names}, passed, {"T": t, "G": g, "H": h},
                      tuple(outputs), rng.choice([1, 2]))  # fmt: skip


PROJ_WIDTHS = (128, 200, 512, 700, 1280, 2100)


def _prologue(rng: random.Random, x: Node, gamma: Node | None, eps: Node, scalars: list[Node],
              dtype: str) -> tuple[Node, list[str]]:  # fmt: skip
    """`xn = bf16(<row math of x>)` (a norm, or a random row expression), or x itself."""
    if rng.random() < 0.4:
        return x, []
    gen = Gen(rng, [x], [gamma] if gamma else [], scalars, eps)
    if rng.random() < 0.5:
        node = gen._row_form(rng.choice(["norm", "softmax", "rstd"]), x)
    else:
        node = gen.expr(rng.randint(0, 2))
    node = node if node.kind == "row" else bi("mul", x, node)
    xn = cast(dtype, node)
    return named("xn", xn), [f"xn = {xn.text}"]


def proj_case(rng: random.Random) -> OracleCase:
    """One to three projections of one operand (x, or a prologue's cast of row math of x), each with an
    elementwise epilogue of its own (a bias, an activation, a residual, scalars, casts); two of them may be
    the column halves of one packed weight."""
    r, k = rng.choice([1, 7, 77, 130, 300]), rng.choice([128, 384, 1280, 4096])
    count = rng.randint(1, 3)
    dtype = rng.choice(["bf16", "bf16", "f16"])  # both matmul operands share it, or the weights are fp8
    wdt = rng.choice((dtype, dtype, *WEIGHT_FP8))
    widths = [rng.choice(PROJ_WIDTHS) for _ in range(count)]
    packed = count >= 2 and rng.random() < 0.3  # projections 0 and 1: halves of one [K, 2 * N0] weight
    if packed:
        widths[1] = widths[0]
    dims = {"R": r, "K": k} | {f"N{j}": n for j, n in enumerate(widths) if not (packed and j == 1)}
    ndim = lambda j: "N0" if packed and j == 1 else f"N{j}"  # noqa: E731
    plines, passed, eps, scalars = _params(rng)
    decl, sizes = {"x": f"{dtype}[R, K]"}, {"x": (r, k)}
    if rng.random() < 0.5:
        decl["gamma"], sizes["gamma"] = "f32[K]", (k,)
    x = _leaf("x", "row")
    xn, body = _prologue(rng, x, _leaf("gamma", "vec") if "gamma" in decl else None, eps, scalars, dtype)
    mms = []
    if packed:
        decl["wp"], sizes["wp"] = f"{wdt}[K, 2 * N0]", (k, 2 * widths[0])
        whole = named("pp", Node("mm", (xn, _leaf("wp", "row")), f"({xn.text} @ wp)", "row"))
        body.append(f"pp = {whole.args[0].text}")
        n0 = widths[0]
        mms += [Node("slice", (whole,), "pp[:, 0:N0]", "row", "any", (1, 0, n0)),
                Node("slice", (whole,), "pp[:, N0:2 * N0]", "row", "any", (1, n0, 2 * n0))]  # fmt: skip
    for j in range(len(mms), count):
        decl[f"w{j}"], sizes[f"w{j}"] = f"{wdt}[K, {ndim(j)}]", (k, widths[j])
        mms.append(Node("mm", (xn, _leaf(f"w{j}", "row")), f"({xn.text} @ w{j})", "row"))
    if wdt in FP8:  # per-output-channel scales
        for j in range(count):
            decl[f"s{j}"], sizes[f"s{j}"] = f"f32[{ndim(j)}]", (widths[j],)
        mms = [bi("mul", mm, _leaf(f"s{j}", "vec")) for j, mm in enumerate(mms)]
    outputs, lines = [], []
    for j, mm in enumerate(mms):
        out, more = _epilogue(rng, j, mm, ndim(j), widths[j], r, decl, sizes, eps, scalars)
        outputs.append(out)
        body += more
        lines.append(f"output {out.name}: {out.dtype}[{out.shape}]")
    head = ["kernel k", "dim " + ", ".join(dims), "require K % 128 == 0"]
    head += [f"input {n}: {d}" for n, d in decl.items()]
    check = "check " + " ".join(f"{n}={v}" for n, v in dims.items())
    text = "\n".join(head + plines + lines + body + [check]) + "\n"
    scale = {n: "fan_in" for n in decl if n.startswith("w")}
    inputs = tuple((n, d.split("[")[0], scale.get(n, "unit")) for n, d in decl.items())
    return OracleCase(text, inputs, sizes, passed, dims, tuple(outputs), rng.choice([1, 2]))


def _epilogue(rng: random.Random, j: int, mm: Node, width: str, n: int, r: int, decl: dict[str, str],
              sizes: dict[str, tuple[int, ...]], eps: Node,
              scalars: list[Node]) -> tuple[Output, list[str]]:  # fmt: skip
    """Projection `j`'s epilogue statements and output: elementwise math of its product, a bias `b{j}`
    and a residual `a{j}` (declared into `decl`)."""
    p = named(f"p{j}", mm)
    body = [f"p{j} = {mm.text}"]
    vectors = []
    if rng.random() < 0.5:
        decl[f"b{j}"], sizes[f"b{j}"] = f"f32[{width}]", (n,)
        vectors.append(_leaf(f"b{j}", "vec"))
    gen = Gen(rng, [p], vectors, scalars, eps, True)
    if rng.random() < 0.4:  # the common shape: act(x @ w + b)
        first = bi("add", p, vectors[0]) if vectors else p
        node = un(rng.choice(ACTS), first)
        body.append(f"e{j}_0 = {node.text}")
        gen.values.append(named(f"e{j}_0", node))
    else:
        body += _statements(gen, 1, f"e{j}_")
    if rng.random() < 0.4:
        decl[f"a{j}"], sizes[f"a{j}"] = f"{rng.choice(DTYPE_NAMES)}[R, {width}]", (r, n)
        gen.values.append(_leaf(f"a{j}", "row"))
    body += _statements(gen, rng.randint(0, 2), f"f{j}_")
    value = next(val for val in reversed(gen.values) if reads(val, p))
    dtype = rng.choice(FFN_OUT_DTYPES)
    node = cast(dtype, value) if rng.random() < 0.5 and dtype in CASTS else value
    body.append(f"o{j} = {node.text}")
    return Output(f"o{j}", dtype, f"R, {width}", node), body
