"""Stage backends/cuda/zeroer.py for mutmut with CudaZeroer's ``@plain_torch`` applied after the class body.

mutmut 3.8.1 mutates no decorated function (a lone @staticmethod or @classmethod aside), so the nine public
entries that 3e53549 and 9ba3621 wrapped in ``@plain_torch`` (577 mutants at 9ba3621) were left out of the
cuda-zeroer runs. Here each such method is defined undecorated and wrapped the same way once the class
exists (``from_dlpack`` through ``classmethod`` again): the same functions, the same behaviour, and mutmut's
trampolines inside the wrappers. Used by scripts/mutation.sh on the staged copy only:

    python scripts/mutation_undecorate.py STAGED/kvlayout/backends/cuda/zeroer.py
"""

from __future__ import annotations

import re
import sys


def undecorate(text: str) -> str:
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("class CudaZeroer"))
    later = [line for line in lines[start + 1 :] if line and not line[0].isspace() and line[0] not in "#)"]
    if later:  # the wrapping is appended at the end of the file: CudaZeroer must be the last statement
        raise SystemExit(f"mutation_undecorate: CudaZeroer is not the last statement ({later[0]!r})")
    out, plain, classmethods = lines[: start + 1], [], []
    for i in range(start + 1, len(lines)):
        if lines[i] == "    @plain_torch":
            name = re.match(r"    def (\w+)\(", lines[i + 1])
            if name is None:
                raise SystemExit(f"mutation_undecorate: no method after @plain_torch: {lines[i + 1]!r}")
            (classmethods if out[-1] == "    @classmethod" else plain).append(name.group(1))
            continue
        out.append(lines[i])
    while out and out[-1] == "":
        out.pop()
    out += ["", "", "# staged by scripts/mutation_undecorate.py: the methods' @plain_torch, after the class"]
    if plain:
        out += [f"for _name in {tuple(plain)!r}:",
                "    setattr(CudaZeroer, _name, plain_torch(CudaZeroer.__dict__[_name]))", "del _name"]
    for n in classmethods:
        out.append(f"CudaZeroer.{n} = classmethod(plain_torch(CudaZeroer.__dict__[{n!r}].__func__))")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    path = sys.argv[1]
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(undecorate(text))
