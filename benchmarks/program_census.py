"""What the program generator and the mutation produce: the census of random programs and of edits.

    python benchmarks/program_census.py --json docs/results/programs/census.json

Draws ``--n`` random programs of the default space (``programs.random_program``) and ``--n`` one-edit
children of the vanilla program (``programs.edit``, the default edit weights), and writes the share of
each with softmax over a dot product, token-by-token weights, a kernel form, an op along time and a
gate (``programs.census``), with the count of each edit kind drawn. And, for a climb's first
generation of n distinct one-edit neighbours of the vanilla program (``--first-generations``, e.g.
4,9,14,19 for populations 5 to 20), the share of ``--n`` such generations holding a program with an
op along time applied to q, to k and to v (a token-mixing edit of each projection). Seeded
(``--seed``): the same command writes the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

VANILLA = "o(mix(w.softmax(t.fixed(s.dot(q,k))),v))"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-generations", default="4,9,14,19", help="neighbours per first generation")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    from evo_attention import programs
    from evo_attention.genes import program_grammar

    grammar, space, rng = program_grammar(), programs.ProgramSpace(), random.Random(args.seed)
    drawn = [programs.random_program(rng, space, grammar) for _ in range(args.n)]
    vanilla = programs.parse(VANILLA, grammar)
    edits = [programs.edit(vanilla, rng, space, grammar) for _ in range(args.n)]
    result = {"kind": "program-census", "n": args.n, "seed": args.seed, "space": space.to_dict(),
              "edit_weights": dict(space.edits), "random_programs": programs.census(drawn),
              "edits_of_vanilla": programs.census(child for _, child in edits),
              "edit_kinds": dict(Counter(kind for kind, _ in edits).most_common()),
              "first_generations": first_generations(vanilla, rng, space, grammar, args.n,
                                                     [int(n) for n in args.first_generations.split(",")]),
              "command": "python benchmarks/program_census.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("random_programs", "edits_of_vanilla", "edit_kinds", "first_generations")},
                     indent=1))
    return 0


def first_generations(vanilla, rng, space, grammar, draws: int, sizes: list) -> dict:
    """Per size n: the share of ``draws`` first generations (n distinct one-edit neighbours of the
    vanilla program, as a climb draws them) holding an op along time on q, on k and on v."""
    from evo_attention import programs

    def time_on(program, name: str) -> bool:
        return any(n.op in programs.TIME_OPS and name in {m.op for m in n.walk()} for n in program.nodes())

    out = {}
    for n in sizes:
        held = Counter()
        for _ in range(draws):
            seen, children = {vanilla.text}, []
            for _ in range(20 * n):
                child = programs.mutate(vanilla, rng, space, grammar)
                if child.text not in seen:
                    seen.add(child.text)
                    children.append(child)
                if len(children) == n:
                    break
            held.update(name for name in "qkv" if any(time_on(c, name) for c in children))
        out[str(n)] = {f"a time op on {name}": held[name] / draws for name in "qkv"}
    return out


if __name__ == "__main__":
    sys.exit(main())
