# Types of the C engine built from _core.c (see its header comment for what each function computes).

def block_sums(
    a: int,
    c: int,
    dtype: int,
    batch: int,
    m: int,
    k: int,
    n: int,
    a_strides: tuple[int, int, int],
    c_strides: tuple[int, int, int],
    rows: int,
    v: int,
    s: int,
) -> None: ...
def magnitude_sums(
    a: int, dtype: int, batch: int, m: int, k: int, a_strides: tuple[int, int, int], rows: int, va: int
) -> None: ...
def cleared(
    s: int,
    r: int,
    v: int,
    va: int,
    b: int,
    batch: int,
    groups: int,
    k: int,
    n: int,
    b_strides: tuple[int, int, int],
    bias: int,
    bias_dtype: int,
    bias_len: int,
    rows: int,
    m: int,
    c_r: float,
    c_v: float,
) -> bool: ...
