"""`genforge ema RUN`: post-hoc EMA of a train.ema.kind=power run (genforge.app.ema, docs/ema.md): synthesise and
select the EMA of a width, sweep widths by a metric, or go back to the trained EMA."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from genforge.app.ema import (SYNTHESIZED, check_metric, check_sigma_rel, headline, headline_result, score_widths,
                              select_trained_ema, synthesize_ema, write_sweep, write_synthesized)
from genforge.app.runs import flag, load_run
from genforge.app.api import sampling_options
from genforge.cli.commands import _check_finite, _enough_memory, _fail, _open_run, _precision, app
from genforge.app.config import MAX_EVAL_SAMPLES
from genforge.app.errors import CheckpointReadError, ConfigError


def _widths(text: str) -> list[float]:
    """The σ_rel of --sweep (comma-separated); exit 2 naming --sweep for one that is not a width."""
    try:
        widths = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        _fail(f"--sweep {text!r}: comma-separated numbers, e.g. 0.05,0.1,0.15")
    if not widths:
        _fail(f"--sweep {text!r}: give at least one sigma_rel")
    for width in widths:
        try:
            check_sigma_rel(width, "--sweep")
        except ConfigError as err:
            _fail(str(err))
    return widths


@app.command("ema")
def ema(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="a run trained with train.ema.kind=power")],
    sigma_rel: Annotated[Optional[float], typer.Option(help="synthesise the EMA of this relative width from the "
                                                            "run's snapshots and make it the one sample, eval and "
                                                            "export use")] = None,
    sweep: Annotated[Optional[str], typer.Option(help="score these widths (comma-separated, e.g. 0.05,0.1,0.15) "
                                                      "with --metric and report the best")] = None,
    metric: Annotated[str, typer.Option(help="--sweep: the metric, e.g. judge or fid")] = "judge",
    n: Annotated[Optional[int], typer.Option("--n", "-n", min=1, max=MAX_EVAL_SAMPLES,
                                             help="--sweep: samples per width (default: eval.n)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="--sweep: the samples' seed (the same for every width)")] = 0,
    trained: Annotated[bool, typer.Option("--trained", help="use the checkpoint's trained EMA again")] = False,
) -> None:
    """Post-hoc EMA (EDM2): the EMA of any width, synthesised from the snapshots of a train.ema.kind=power run.

    --sigma-rel X writes RUN_DIR/ema_synthesized/sigma_rel-X.safetensors and selects it: `genforge sample`, `eval`
    and `export` then use it (the checkpoint's EMA stays; --trained selects it again). --sweep scores several
    widths by one metric, writes RUN_DIR/ema_synthesized/sweep-<metric>.json and reports the best (docs/ema.md)."""
    given = [name for name, value in (("--sigma-rel", sigma_rel), ("--sweep", sweep), ("--trained", trained or None))
             if value is not None]
    if len(given) != 1:
        _fail(f"give one of --sigma-rel, --sweep, --trained (got {', '.join(given) or 'none'})")
    if trained:
        was = select_trained_ema(run_dir)
        typer.echo(f"{run_dir}: sample, eval and export use the checkpoint's trained EMA"
                   + ("" if was else " (no synthesised EMA was selected)"))
        return
    if sigma_rel is not None:
        _check_finite(sigma_rel=sigma_rel)
        _synthesize(run_dir, sigma_rel)
        return
    _sweep(run_dir, _widths(sweep), metric, n, seed)


def _synthesize(run_dir: Path, sigma_rel: float) -> None:
    """`genforge ema RUN --sigma-rel X`."""
    try:
        check_sigma_rel(sigma_rel, "--sigma-rel")
        run = load_run(run_dir, "meta", synthesized=False)  # the model's structure: what the weights must fit
        with _enough_memory("synthesising the EMA"):
            synthesized = synthesize_ema(run, run_dir, sigma_rel)
        path = write_synthesized(run_dir, synthesized)
    except (ConfigError, CheckpointReadError) as err:
        _fail(str(err))
    except OSError as err:
        _fail(f"{run_dir / SYNTHESIZED}: cannot write there ({err.strerror or err})", code=1)
    typer.echo(f"synthesised the EMA of {synthesized.describe()} (checkpoint {synthesized.checkpoint})")
    typer.echo(f"wrote {path}")
    typer.echo(f"genforge sample/eval/export {run_dir} now use it (the trained EMA again: genforge ema {run_dir} "
               "--trained)")


def _sweep(run_dir: Path, widths: list[float], metric: str, n: int | None, seed: int) -> None:
    """`genforge ema RUN --sweep ...`: each width's synthesised EMA scored by one metric."""
    try:
        check_metric(metric)
    except ConfigError as err:  # "metric 'x': allowed ..."
        _fail(f"--{err}")
    run = _open_run(run_dir)
    precision = _precision(None, run.config.train.precision, run.device)
    options = sampling_options(run.config, "eval", flag)

    def score(name: str) -> dict:
        return run.score(name, n, seed, options, precision)

    try:
        scored = score_widths(run, run_dir, widths, metric, score)
    except (ConfigError, CheckpointReadError, ValueError, FileNotFoundError) as err:
        _fail(str(err))
    typer.echo(f"{'sigma_rel':>10} {'gamma':>8}  {headline(metric)}")
    for synthesized, value, _ in scored:
        typer.echo(f"{synthesized.sigma_rel:>10g} {synthesized.gamma:>8.3f}  {value:.4f}")
    try:
        out, best, value = write_sweep(run_dir, metric, n or run.config.eval.n, seed, scored)
    except OSError as err:
        _fail(f"{Path(run_dir) / SYNTHESIZED}: cannot write the sweep ({err.strerror or err}); the scores above "
              "were not written", code=1)
    typer.echo(f"best: sigma_rel {best.sigma_rel:g} ({headline_result(metric)} {value:.4f})")
    typer.echo(f"wrote {out}")
    typer.echo(f"select it: genforge ema {run_dir} --sigma-rel {best.sigma_rel:g}")
