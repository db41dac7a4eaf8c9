"""TPE: Optuna's Tree-structured Parzen Estimator (multivariate) behind the ask/tell interface.

Optuna is an optional dependency (``pip install 'evo-attention[tpe]'``); naming ``tpe`` without it
is a one-line error. The Optuna study lives in memory only: the run store stays the single source
of truth, and a resumed run rebuilds the study by replay (the driver tells a fresh strategy the
stored results generation by generation), so it asks exactly what the interrupted one would have.

- Each gene field with more than one option in the search space is one categorical parameter
  (its options are the choices); a field with one option is fixed. ``gene_from_params`` is the one
  place where trial parameters become a gene.
- Generation 0 is ``population_size`` distinct random genes drawn from the strategy's own
  ``random.Random(seed)``, the same as the GA's first generation for the same seed; they enter
  the study as finished trials when told. Every later generation asks the sampler
  (``TPESampler(multivariate=True, n_startup_trials=0, seed=seed)``) for a batch of
  ``population_size - elite_size`` trials, the other strategies' batch size.
- Several objectives make it Optuna's multi-objective TPE (one minimised direction each).
  Failures are told ``inf`` in every objective, so the sampler learns to avoid them.
- ``dedupe`` (on by default): a proposal whose key was asked before in this run or repeats one of
  its batch is marked failed in the study (Optuna's TPE ignores failed trials) and asked again; after
  ``DEDUPE_TRIES`` such proposals the slot gets a gene drawn uniformly among those not asked yet
  (enqueued as the next trial's parameters), so a batch never wastes a training on a repeat while
  the space has unasked genes. A generation-0 gene outside the space (``seed_vanilla`` with a
  narrowed space) is evaluated but not added to the study, which only knows the space's options.
- Warm start (``warm_start``, ``init_from``): the given genes are enqueued (``study.enqueue_trial``)
  and asked as the study's first trials; random genes fill the rest of generation 0 as above.
- Constraints (a run with caps, ``constraints``): every trial carries its excess over each cap as an
  Optuna constraint (at most 0: kept), so the sampler prefers feasible genes and, among infeasible
  ones, those that break the caps least. With an Optuna that has ``Trial.set_constraint`` (5.0 on)
  the constraints are set on the trial; with an older one the sampler gets a ``constraints_func``
  reading the trial's user attribute ``constraints``. A gene refused before training is told ``inf``
  in every objective with its constraints.

Determinism: the sampler has its own seeded generator and sees the same trials in the same order,
so the same seed and the same told values give the same proposals.
"""

from __future__ import annotations

import warnings
from typing import Any

from evo_attention.genes import ALL_FIELDS, AttentionGene, SearchSpace, violation
from evo_attention.search.base import Strategy, draw_new_gene
from evo_attention.search.random_search import RandomSearch
from evo_attention.train.config import as_bool
from evo_attention.util.errors import UserError

DEDUPE_TRIES = 20
INSTALL_HINT = "pip install 'evo-attention[tpe]' (or pip install optuna)"


def import_optuna(setting: str = "strategy"):
    """The optuna module, or a one-line ``UserError`` saying how to install it for ``setting`` (strategy
    tpe, or optuna_journal)."""
    try:
        import optuna
    except ImportError:
        what, instead = ("strategy tpe", ", or choose another strategy") if setting == "strategy" else (setting, "")
        raise UserError(f"{what} needs Optuna, which is not installed: {INSTALL_HINT}{instead}",
                        setting=setting) from None
    return optuna


def gene_from_params(params: dict[str, Any], space: SearchSpace) -> AttentionGene | None:
    """The gene of a trial's parameters (the fields it does not name take their only option); None
    when the combination breaks a validity rule of genes.RULES (the trial is then failed and TPE
    asks again)."""
    values = {name: params[name] if name in params else space.options(name)[0] for name in ALL_FIELDS}
    return None if violation(values) else AttentionGene(gene_dict=values)


def sets_constraints(optuna) -> bool:
    """Whether this Optuna sets constraints on a trial (``Trial.set_constraint``, 5.0 on)."""
    return hasattr(optuna.trial.Trial, "set_constraint")


def _constraints_of(trial) -> tuple:
    """The ``constraints_func`` of an Optuna without ``Trial.set_constraint``: the trial's excess over
    each cap, kept in its user attribute ``constraints``."""
    return tuple(trial.user_attrs.get("constraints", ()))


def constraint_attrs(names, values, *, named: bool = False) -> dict:
    """The keyword arguments of ``optuna.trial.create_trial`` that give a finished trial its
    constraints (``values``, one per cap ``names``; none for None): the user attribute
    ``constraints`` (with ``constraint_names``) and the constraints Optuna's samplers and
    optuna-dashboard read: by name (``create_trial(constraints=...)``, Optuna 5 on) when ``named``,
    else the system attribute ``constraints`` holding the values in order, which every Optuna
    version reads."""
    if values is None:
        return {}
    attrs = {"user_attrs": {"constraints": list(values), "constraint_names": list(names)}}
    if named:
        attrs["constraints"] = {name: float(v) for name, v in zip(names, values)}
    else:
        attrs["system_attrs"] = {"constraints": tuple(float(v) for v in values)}
    return attrs


class TPE(RandomSearch):
    """Optuna's multivariate TPE sampler, asked in the GA's batch sizes, with random search's
    bookkeeping (everything evaluated, ranked; each batch its history)."""

    name = "tpe"
    OPTIONS = {**Strategy.OPTIONS, "n_ei_candidates": 24, "dedupe": True}

    def __init__(self, *, n_ei_candidates: int = 24, dedupe: bool = True, **batches):
        super().__init__(**batches)
        optuna = import_optuna()
        from optuna.distributions import CategoricalDistribution

        self.n_ei_candidates = int(n_ei_candidates)
        if self.n_ei_candidates < 1:
            raise UserError(f"n_ei_candidates {n_ei_candidates!r} must be a positive integer", setting="n_ei_candidates")
        self.dedupe = as_bool("dedupe", dedupe)
        self._optuna = optuna
        if self.space.layers:
            raise UserError("strategy tpe samples one gene shared by every layer: use genome shared, or ga, nsga2 or "
                            "random for per-layer genomes", setting="genome")
        if self.space.program_space is not None:
            raise UserError("strategy tpe samples categorical options and cannot encode programs: use ga, random, "
                            "neighbours, nsga2 or climb for a program search space", setting="strategy")
        self.distributions = {name: CategoricalDistribution(self.space.options(name)) for name in ALL_FIELDS
                              if len(self.space.options(name)) > 1}
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # how constraints reach the sampler: set on each trial (Optuna 5 on), else a constraints_func
        self._set_constraints = bool(self.constraints) and sets_constraints(optuna)
        extra = {"constraints_func": _constraints_of} if self.constraints and not self._set_constraints else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is marked experimental
            sampler = optuna.samplers.TPESampler(multivariate=True, n_startup_trials=0,
                                                 n_ei_candidates=self.n_ei_candidates, seed=self.seed % 2**32, **extra)
        self.study = optuna.create_study(directions=["minimize"] * self.n_objectives, sampler=sampler)
        self._trials: list = []  # the open trial of each asked gene (None: added to the study when told)

    # -- ask/tell hooks ---------------------------------------------------------------------------
    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            genes = self._initial_genes()
            warm = {g.key for g in self._warm}
            self._trials = [self._enqueued(g) if g.key in warm else None for g in genes]
            return genes
        genes, self._trials, taken = [], [], set(self._asked_keys)
        for _ in range(self.batch_size(self.generation)):
            gene, trial = self._ask_one(taken)
            genes.append(gene)
            self._trials.append(trial)
            taken.add(gene.key)
        return genes

    def _ask_one(self, taken: set[str]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(DEDUPE_TRIES):
                trial = self.study.ask(self.distributions)
                gene = gene_from_params(trial.params, self.space)
                if gene is not None and (not self.dedupe or gene.key not in taken):
                    return gene, trial
                # a repeat, or a combination a validity rule forbids: failed, so TPE learns to avoid it
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            gene = draw_new_gene(self.rng, self.space, taken)
            self.study.enqueue_trial(self._params(gene))
            trial = self.study.ask(self.distributions)
            return gene_from_params(trial.params, self.space), trial

    def _enqueued(self, gene):
        """The open trial of a warm-start gene, asked through ``enqueue_trial`` (None if its fields
        are not all options of the space: it is then added when told, like a random gene)."""
        params = self._params(gene)
        if params is None:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.study.enqueue_trial(params)
            return self.study.ask(self.distributions)

    def _constraint_values(self, gene) -> list[float] | None:
        """The gene's excess over each cap of the run, in the order of ``constraints`` (0 where
        unknown); None for an unconstrained run."""
        if not self.constraints:
            return None
        excess = self.excess_of(gene)
        if set(excess) == {"total"}:  # told as one number: the first constraint carries it
            return [float(excess["total"])] + [0.0] * (len(self.constraints) - 1)
        return [float(excess.get(name, 0.0)) for name in self.constraints]

    def _update(self, told):
        for (gene, fitness), trial in zip(told, self._trials):
            values = list(fitness) if isinstance(fitness, tuple) else [fitness]  # finite or inf (Strategy.tell)
            constraints = self._constraint_values(gene)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if trial is not None:
                    if constraints is not None:
                        trial.set_user_attr("constraints", constraints)
                        if self._set_constraints:
                            for name, value in zip(self.constraints, constraints):
                                trial.set_constraint(name, value)
                    self.study.tell(trial, values)
                else:
                    params = self._params(gene)
                    if params is not None:
                        self.study.add_trial(self._optuna.trial.create_trial(
                            params=params, distributions=self.distributions, values=values,
                            **constraint_attrs(self.constraints, constraints, named=self._set_constraints)))
        self._trials = []
        super()._update(told)

    def _params(self, gene: AttentionGene) -> dict | None:
        """The trial parameters of ``gene``; None if a field's value is not an option of the space."""
        values = gene.to_dict()
        if any(values[name] not in dist.choices for name, dist in self.distributions.items()):
            return None
        if any(len(self.space.options(name)) == 1 and values[name] != self.space.options(name)[0]
               for name in ALL_FIELDS):
            return None
        return {name: values[name] for name in self.distributions}
