"""Planted bugs: for rows of docs/testing.md's feature table, a bug in the code the row
documents, and the row's tests that must catch it.

    python tests/plants.py            # every plant, one at a time
    python tests/plants.py --row seed # the plants of the rows whose text holds "seed"
    python tests/plants.py --list     # the plants, and the rows no plant covers yet

Each plant replaces an exact text of one file (found there exactly once), runs the tests
it names in one pytest process, and puts the file back as it was (its bytes and its time,
also on Ctrl-C or SIGTERM), then prints a table: caught (a named test failed), survived
(every one passed), or no longer applies (the text is gone or not once in its file).
Exit 0 when every plant chosen was caught. The tests run without writing bytecode, so a
planted module's compiled copy never outlives the plant. A plant changes the working
tree while it runs: do not edit the repository meanwhile.

`tests/test_documented.py` holds this list to the table: every plant applies to today's
code and names tests its row names; every row has a plant or is in `UNPLANTED`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Plant:
    """`old` replaced by `new` in `file`: a bug in what `row` documents, which one of
    `tests` (node ids the row names) must catch."""

    row: str  # the table's first cell, as written
    file: str  # from the repository's top
    old: str
    new: str
    tests: tuple[str, ...]


def _p(row: str, file: str, old: str, new: str, *tests: str) -> Plant:
    return Plant(row, file, old, new, tests)


SHARDS = "tests/data/test_shards.py::"
KEYS_AND_SPLIT = SHARDS + "test_the_shard_keys_and_the_test_splits_size_decide_what_prepare_writes"
PLANTS: tuple[Plant, ...] = (
    _p(
        "`prepare.num_shards` `--num-shards`",
        "tasks/data/shards.py",
        "wanted = cfg.num_shards or math.ceil(",
        "wanted = math.ceil(",
        SHARDS + "test_digits_round_trip_matches_source",
    ),
    _p(
        "`prepare.target_shard_mb` `--target-shard-mb`",
        "tasks/data/shards.py",
        "(cfg.target_shard_mb * 2**20)",
        "(1000 * 2**20)",
        KEYS_AND_SPLIT,
    ),
    _p(
        "`prepare.min_shards` `--min-shards`",
        "tasks/data/shards.py",
        "n = max(1, min(max(wanted, min_shards), count))",
        "n = max(1, min(wanted, count))",
        KEYS_AND_SPLIT,
    ),
    _p(
        "`prepare.synthetic.test_examples` `--test-examples`",
        "tasks/data/datasets.py",
        '"test": s.test_examples}',
        '"test": 1024}',
        KEYS_AND_SPLIT,
    ),
    _p(
        "`prepare.test_fraction`",
        "tasks/data/datasets.py",
        "held = test_rows(labels, cfg.test_fraction, cfg.seed, stratify=True)",
        "held = test_rows(labels, 0.2, cfg.seed, stratify=True)",
        SHARDS + "test_flat_image_folder_holds_out_a_seeded_stratified_split",
    ),
    _p(
        "`prepare.seed` `--seed`",
        "tasks/data/datasets.py",
        "held = test_rows(labels, cfg.test_fraction, cfg.seed, stratify=True)",
        "held = test_rows(labels, cfg.test_fraction, 42, stratify=True)",
        SHARDS + "test_flat_image_folder_holds_out_a_seeded_stratified_split",
    ),
    _p(
        "`prepare.label_kind` `--label-kind`",
        "tasks/data/user_sources.py",
        "return label_coding(raw, cfg.label_kind, what, names)",
        'return label_coding(raw, "auto", what, names)',
        "tests/core/test_label_kinds.py::test_the_kind_asked_for_is_the_kind_prepared",
    ),
    _p(  # only binary and multi_label honoured: class and real asked for read as auto
        "`prepare.label_kind` `--label-kind`",
        "tasks/data/streams.py",
        '    if kind == "auto":\n        kind, why = _named_kind',
        '    if kind not in ("binary", "multi_label"):\n        kind, why = _named_kind',
        "tests/core/test_label_kinds.py::test_the_kind_asked_for_is_the_kind_prepared",
    ),
    _p(
        "`prepare.missing` `--missing`",
        "tasks/data/user_sources.py",
        "        cfg.missing,\n",
        '        "mean",\n',
        "tests/data/test_user_data.py::"
        "test_blanks_filled_with_the_training_splits_mean_or_zero_or_their_rows_dropped",
    ),
    _p(
        "`prepare.color_mode` `--color-mode`",
        "tasks/data/datasets.py",
        "mode = COLOR_MODES[cfg.color_mode]",
        'mode = COLOR_MODES["rgb"]',
        SHARDS + "test_an_image_folder_is_read_as_kerass_image_dataset_from_directory_reads_it",
    ),
    _p(
        "`prepare.synthetic.classes` `--classes`",
        "tasks/data/datasets.py",
        'tuple(f"class_{i}" for i in range(s.classes))',
        'tuple(f"class_{i}" for i in range(10))',
        SHARDS + "test_synthetic_labels_follow_class_prototypes",
    ),
    _p(
        "`prepare.synthetic.signal` `--signal`",
        "tasks/data/datasets.py",
        "SyntheticSource(cfg.seed, spec, splits, s.signal, s.label_noise)",
        "SyntheticSource(cfg.seed, spec, splits, 0.75, s.label_noise)",
        SHARDS + "test_a_harder_synthetic_task_flips_its_label_noise_share_and_blends_less_signal",
    ),
    _p(
        "`prepare.synthetic.label_noise` `--label-noise`",
        "tasks/data/datasets.py",
        "SyntheticSource(cfg.seed, spec, splits, s.signal, s.label_noise)",
        "SyntheticSource(cfg.seed, spec, splits, s.signal, 0.0)",
        SHARDS + "test_a_harder_synthetic_task_flips_its_label_noise_share_and_blends_less_signal",
    ),
    _p(
        "`train.seed`",
        "tasks/train/training.py",
        "            seed=cfg.seed,\n            cache=cfg.cache,",
        "            seed=42,\n            cache=cfg.cache,",
        SHARDS + "test_training_batches_are_static_and_seeded",
    ),
    _p(
        "`train.shuffle_buffer`",
        "tasks/train/training.py",
        "            shuffle_buffer=cfg.shuffle_buffer,",
        "            shuffle_buffer=4096,",
        SHARDS + "test_a_shuffle_buffer_of_one_keeps_the_order_the_shards_are_read_in",
    ),
    _p(
        "`train.scaling` `--scaling`",
        "tasks/train/training.py",
        '    if cfg.scaling == "weak":\n        return cfg.per_replica_batch',
        "    if True:\n        return cfg.per_replica_batch",
        "tests/train/test_training.py::test_batch_sizes_for_weak_and_strong_scaling",
    ),
    _p(
        "`train.steps_per_call` `--steps-per-call`",
        "tasks/train/training.py",
        "rate.value, cfg.steps_per_call, rate.rule",
        "rate.value, 1, rate.rule",
        "tests/train/test_training.py::"
        "test_steps_per_call_sets_how_many_steps_each_graph_call_runs",
    ),
    _p(
        "`train.measure_rounds` `--measure-rounds`",
        "tasks/measure/diagnosis.py",
        "rounds=cfg.measure_rounds, aim=cfg.measure_precision",
        "rounds=25, aim=cfg.measure_precision",
        "tests/measure/test_diagnosis.py::"
        "test_weak_scaling_diagnosis_times_every_configuration_in_the_same_rounds",
    ),
    _p(
        "`prepare.synthetic.channels` `--channels`",
        "tasks/data/datasets.py",
        "(s.height, s.width, s.channels), tuple(",
        "(s.height, s.width, 3), tuple(",
        SHARDS + "test_synthetic_images_have_the_channels_asked_for",
    ),
    _p(
        "`prepare.synthetic.train_examples` `--examples`",
        "tasks/data/datasets.py",
        'splits = {"train": s.train_examples,',
        'splits = {"train": 4096,',
        SHARDS + "test_synthetic_ranges_match_a_full_pass_across_chunks",
    ),
    _p(
        "`tfscale prepare --force`",
        "tasks/data/preparation.py",
        "    if force:\n        remove_written(out_dir)",
        "    if False:\n        remove_written(out_dir)",
        SHARDS + "test_force_rewrites_every_shard_of_an_up_to_date_dataset",
    ),
    _p(
        "`train.grad_accum_steps` `--grad-accum-steps`",
        "tasks/train/training.py",
        "    k = cfg.grad_accum_steps\n",
        "    k = 1\n",
        "tests/train/test_training.py::"
        "test_gradient_accumulation_equals_the_larger_batch_under_mirrored",
    ),
    _p(
        "`train.lr_scaling` `--lr-scaling`",
        "tasks/train/training.py",
        "    rule = cfg.lr_scaling\n",
        '    rule = "auto"\n',
        "tests/train/test_gradient_noise.py::"
        "test_each_learning_rate_rule_at_four_times_the_base_batch",
    ),
    _p(
        "`train.learning_rate` `--learning-rate`",
        "tasks/train/training.py",
        "base = base_rate(compiled, cfg.learning_rate)",
        "base = base_rate(compiled, 1e-3)",
        "tests/train/test_training.py::"
        "test_the_learning_rate_asked_for_is_the_rate_a_built_in_model_trains_at",
    ),
    _p(
        "`train.cache`",
        "tasks/train/training.py",
        "            cache=cfg.cache,\n",
        "            cache=True,\n",
        "tests/train/test_training.py::"
        "test_train_cache_decides_whether_the_training_pipeline_caches_its_examples",
    ),
    _p(
        "`sweep.replicas`",
        "tasks/execute/sweep_cells.py",
        "replicas = sorted({1, *s.replicas})",
        "replicas = sorted(set(s.replicas))",
        "tests/report/test_sweep.py::test_plan_always_includes_one_replica",
    ),
    _p(
        "`sweep.scaling`",
        "tasks/execute/sweep_cells.py",
        "s.dataset_sizes, s.batch_sizes, s.scaling, s.precision, replicas",
        's.dataset_sizes, s.batch_sizes, ("weak",), s.precision, replicas',
        "tests/report/test_sweep.py::"
        "test_each_scaling_mode_is_an_axis_with_its_own_one_replica_baseline",
    ),
    _p(
        "`tfscale forecast --scaling`",
        "tasks/report/forecast.py",
        'batch = self.per_replica_batch if scaling == "weak" else whole / workers',
        "batch = self.per_replica_batch",
        "tests/report/test_forecast.py::test_predictions_follow_the_ring_formula",
    ),
    _p(
        "`tfscale plan --json`",
        "flows/commands.py",
        "print(json.dumps(result.to_dict(), indent=2) if args.json else format_plan(result))",
        "print(format_plan(result))",
        "tests/report/test_forecast.py::test_plan_json_prints_plan_json_in_place_of_the_table",
    ),
    _p(
        "`tfscale --debug`",
        "flows/cli.py",
        "    except UserError as exc:\n        if args.debug:",
        "    except UserError as exc:\n        if False:",
        "tests/settings/test_config.py::"
        "test_an_error_the_user_caused_is_one_line_with_the_fix_and_its_exit_code",
    ),
    _p(
        "`track.ui_url`",
        "tasks/track/tracking.py",
        "        self.ui_url = ui_url\n",
        '        self.ui_url = "http://127.0.0.1:5000"\n',
        "tests/track/test_tracking.py::test_links_point_where_the_ui_is",
    ),
    _p(
        "`train.jit_compile` `--jit-compile`",
        "tasks/distribute/strategy.py",
        "    if cfg.jit_compile and spec is not BASELINE:",
        "    if False:",
        "tests/measure/test_autotune.py::test_jit_compile_takes_auto_true_or_false_only",
    ),
    _p(
        "`evaluate.every_epochs` `--evaluate-every`",
        "tasks/train/training.py",
        "every = interval_examples(evaluate.every_epochs, train_examples)",
        "every = interval_examples(1, train_examples)",
        "tests/train/test_to_target.py::test_evaluation_off_measures_nothing_and_trains_as_before",
    ),
    _p(
        "`evaluate.target_accuracy` `--target-accuracy`",
        "tasks/train/to_target.py",
        "        value = evaluate.target_accuracy\n",
        "        value = 0.96\n",
        "tests/train/test_to_target.py::"
        "test_a_mirrored_training_stops_at_the_evaluation_that_reaches_the_target",
    ),
    _p(
        "`sweep.dataset_sizes`",
        "tasks/execute/sweep_cells.py",
        "s.dataset_sizes, s.batch_sizes, s.scaling, s.precision, replicas",
        "s.dataset_sizes[:1], s.batch_sizes, s.scaling, s.precision, replicas",
        "tests/report/test_sweep.py::test_table_and_charts_hold_every_cell",
    ),
    _p(
        "`sweep.batch_sizes`",
        "tasks/execute/sweep_cells.py",
        "s.dataset_sizes, s.batch_sizes, s.scaling, s.precision, replicas",
        "s.dataset_sizes, s.batch_sizes[:1], s.scaling, s.precision, replicas",
        "tests/report/test_sweep.py::"
        "test_the_grid_is_every_size_batch_scaling_and_precision_each_with_its_one_replica",
    ),
    _p(
        "`sweep.precision`",
        "tasks/execute/sweep_cells.py",
        "s.dataset_sizes, s.batch_sizes, s.scaling, s.precision, replicas",
        "s.dataset_sizes, s.batch_sizes, s.scaling, s.precision[:1], replicas",
        "tests/report/test_sweep.py::"
        "test_the_grid_is_every_size_batch_scaling_and_precision_each_with_its_one_replica",
    ),
    _p(
        "`sweep.micro_batches`",
        "tasks/execute/sweep_cells.py",
        "micros: tuple = tuple(dict.fromkeys(s.micro_batches)) if",
        "micros: tuple = tuple(s.micro_batches[:1]) if",
        "tests/report/test_sweep.py::test_a_pipeline_sweep_takes_stages_and_micro_batches_as_axes",
    ),
    _p(
        "`tfscale --params`",
        "flows/cli.py",
        "load_config(args.params or DEFAULT_PARAMS, overrides, named=args.params is not None)",
        "load_config(DEFAULT_PARAMS, overrides, named=False)",
        "tests/settings/test_config.py::test_cli_exits_2_on_bad_config_and_writes_nothing",
    ),
    _p(
        "`train.strategy` `--strategy`",
        "tasks/distribute/strategy.py",
        '    if cfg.strategy != "auto":\n        return cfg.strategy,',
        "    if False:\n        return cfg.strategy,",
        "tests/distribute/test_strategy.py::test_policy_table",
    ),
    _p(
        "integer labels of more than 256 values",
        "tasks/core/label_kinds.py",
        "MAX_CLASSES = 256  #",
        "MAX_CLASSES = 100_000  #",
        "tests/core/test_label_kinds.py::test_each_kind_is_read_as_a_keras_user_means_it",
    ),
    _p(
        "a model function of no parameter",
        "tasks/train/user_models.py",
        'return called(function, (spec,) if takes else (), f"--model {ref}"',
        'return called(function, (spec,), f"--model {ref}"',
        "tests/train/test_documented_models.py::"
        "test_a_model_function_of_no_parameter_is_called_with_nothing",
    ),
    _p(
        "a subclassed model without `get_config`",
        "tasks/train/user_models.py",
        "    try:\n        model.get_config()\n    except NotImplementedError:",
        "    try:\n        pass\n    except NotImplementedError:",
        "tests/train/test_documented_models.py::"
        "test_a_subclassed_model_without_get_config_is_refused_before_training",
    ),
    _p(
        "a compiled learning-rate schedule (rule `none`)",
        "tasks/train/optimizers.py",
        "    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):\n"
        "        return None",
        "    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):\n"
        "        return default",
        "tests/train/test_documented_models.py::"
        "test_a_compiled_schedule_is_kept_as_the_rate_with_rule_none",
    ),
    _p(
        "`train.batch_size_per_replica` `--batch-size-per-replica`",
        "flows/cli.py",
        "        return int(text)\n",
        "        return 32\n",
        "tests/settings/test_config.py::test_the_batch_flag_takes_auto_or_a_number",
    ),
    _p(
        "`train.class_weight` `--class-weight`",
        "tasks/core/class_weights.py",
        "return tuple(total / (len(names) * count) for count in counts)",
        "return tuple(1.0 for count in counts)",
        "tests/core/test_class_weights.py::"
        "test_a_run_makes_balanced_the_weights_of_its_training_split_and_says_them",
    ),
    _p(
        "`prepare.sample_weight` `--sample-weight`",
        "tasks/data/user_sources.py",
        "chosen = cfg.sample_weight or (WEIGHT_NAME",
        "chosen = (WEIGHT_NAME",
        "tests/data/test_user_data.py::"
        "test_each_examples_weight_reaches_the_shards_beside_it_never_as_a_feature",
    ),
    _p(
        "`tfscale forecast --workers`",
        "flows/commands.py",
        "run_dir, args.workers, args.link_gbit, args.preset, args.scaling, args.out_dir",
        "run_dir, [1, 2], args.link_gbit, args.preset, args.scaling, args.out_dir",
        "tests/report/test_forecast.py::test_forecast_writes_its_table_json_and_charts",
    ),
    _p(
        "`tfscale forecast --preset`",
        "flows/commands.py",
        "run_dir, args.workers, args.link_gbit, args.preset, args.scaling, args.out_dir",
        "run_dir, args.workers, args.link_gbit, None, args.scaling, args.out_dir",
        "tests/report/test_forecast.py::test_forecast_writes_its_table_json_and_charts",
    ),
    _p(
        "`tfscale forecast --out-dir`",
        "flows/commands.py",
        "run_dir, args.workers, args.link_gbit, args.preset, args.scaling, args.out_dir",
        "run_dir, args.workers, args.link_gbit, args.preset, args.scaling, None",
        "tests/report/test_forecast.py::"
        "test_forecast_writes_its_json_and_charts_to_the_out_dir_leaving_the_run_as_it_was",
    ),
    _p(
        "`tfscale forecast --runs-dir`, `tfscale plan --runs-dir`",
        "flows/commands.py",
        "check_request(args.workers, args.link_gbit, args.preset)  # usage errors first\n"
        "    run_dir = probed_run(config.train.runs_dir, config.prepare.dataset, args.run_dir)",
        "check_request(args.workers, args.link_gbit, args.preset)  # usage errors first\n"
        '    run_dir = probed_run("runs", config.prepare.dataset, args.run_dir)',
        "tests/report/test_forecast.py::test_forecast_writes_its_table_json_and_charts",
    ),
    _p(
        "`tfscale forecast --run-dir`, `tfscale plan --run-dir`",
        "flows/commands.py",
        "check_request(args.workers, args.link_gbit, args.preset)  # usage errors first\n"
        "    run_dir = probed_run(config.train.runs_dir, config.prepare.dataset, args.run_dir)",
        "check_request(args.workers, args.link_gbit, args.preset)  # usage errors first\n"
        "    run_dir = probed_run(config.train.runs_dir, config.prepare.dataset, None)",
        "tests/report/test_forecast.py::"
        "test_forecast_writes_its_json_and_charts_to_the_out_dir_leaving_the_run_as_it_was",
    ),
    _p(
        "blank numeric cells",
        "tasks/data/blanks.py",
        '    if missing == "refuse":\n        shown =',
        "    if False:\n        shown =",
        "tests/data/test_user_data.py::"
        "test_blank_cells_are_refused_naming_each_column_and_count_before_a_shard_is_written",
    ),
    _p(
        "empty labels",
        "tasks/data/tables.py",
        '    if blank:\n        raise DatasetError(\n            f"{path}: '
        "column {label!r} has {blank} empty",
        '    if False:\n        raise DatasetError(\n            f"{path}: '
        "column {label!r} has {blank} empty",
        "tests/data/test_documented_data.py::"
        "test_empty_labels_are_refused_at_prepare_naming_the_column_and_count",
    ),
    _p(
        "`$TFDS_DATA_DIR`",
        "tasks/data/tfds_source.py",
        'data_dir=os.environ.get("TFDS_DATA_DIR")',
        "data_dir=None",
        "tests/data/test_documented_data.py::test_tfds_reads_its_sets_from_tfds_data_dir",
    ),
    _p(
        "`--dataset digits`, `synthetic`",
        "tasks/data/datasets.py",
        "load_digits_source(cfg.seed, cfg.test_fraction)",
        "load_digits_source(cfg.seed + 1, cfg.test_fraction)",
        "tests/data/test_shards.py::test_digits_round_trip_matches_source",
    ),
    _p(
        "`train.stages` `--stages`",
        "tasks/distribute/strategy.py",
        "    if cfg.stages > devices:\n",
        "    if False:\n",
        "tests/train/test_stages.py::test_stage_settings_that_cannot_work_are_named_with_the_fix",
    ),
    _p(
        "`train.micro_batches` `--micro-batches`",
        "tasks/distribute/strategy.py",
        "    if micro_batches and cfg.per_replica_batch % cfg.micro_batches:\n",
        "    if False:\n",
        "tests/train/test_stages.py::test_stage_settings_that_cannot_work_are_named_with_the_fix",
    ),
    _p(
        "`--target-metric mae` (compiled)",
        "tasks/train/objectives.py",
        '_LOWER_SHORT = ("mse", "mae", "mape", "msle", "rmse")',
        '_LOWER_SHORT = ("mse", "mape", "msle", "rmse")',
        "tests/train/test_documented_targets.py::"
        "test_a_compiled_mae_is_the_held_out_mean_absolute_error_reached_from_above",
    ),
    _p(
        "`tfscale hardware --json`",
        "flows/commands.py",
        "    choice = select_strategy(report, config.train)\n    if args.json:\n",
        "    choice = select_strategy(report, config.train)\n    if False:\n",
        "tests/flows/test_documented_features.py::"
        "test_hardware_json_prints_the_report_and_the_strategy_it_would_pick",
    ),
    _p(
        "an uncompiled model's regularisers (`model.losses`) in its step loss",
        "tasks/train/keras_meaning.py",
        "    extra = [tf.cast(tf.reduce_sum(each), tf.float32) for each in model.losses]",
        "    extra = []",
        "tests/train/test_documented_models.py::"
        "test_an_uncompiled_models_regularisers_enter_its_step_loss",
    ),
    _p(
        "`tfscale plan --device-memory-mb`",
        "tasks/train/stage_plan.py",
        "    budget = device_memory_mb * MB\n",
        '    budget = float("inf")\n',
        "tests/report/test_forecast.py::"
        "test_a_plan_searches_only_the_batches_that_fit_a_devices_memory",
    ),
    _p(
        "`tfscale prepare --no-progress`",
        "flows/commands.py",
        "progress=not args.no_progress)",
        "progress=True)",
        SHARDS + "test_no_progress_keeps_the_bar_off_a_stand_in_terminal_that_shows_it_otherwise",
    ),
    _p(  # read-only: the shards verified elsewhere than the folder named
        "`prepare.data_dir` `--data-dir`",
        "flows/commands.py",
        "    manifest = verify_shards(dataset_dir(config), config.prepare.dataset)",
        '    manifest = verify_shards(dataset_dir(config).with_name("x"), config.prepare.dataset)',
        SHARDS + "test_verify_names_the_damaged_shard",
    ),
    _p(
        "`train.workers` `--workers`",
        "tasks/settings/config.py",
        "        return max(named, self.train.workers, sweep_workers)",
        "        return max(named, sweep_workers)",
        SHARDS + "test_shards_never_fewer_than_workers",
    ),
    _p(
        "a TFDS set that cannot download",
        "tasks/data/tfds_source.py",
        'f"the prepared dataset under $TFDS_DATA_DIR."',
        'f"a prepared copy of it."',
        "tests/data/test_documented_data.py::"
        "test_a_tfds_set_that_cannot_download_is_refused_naming_the_local_copy",
    ),
    _p(
        "a blank text cell",
        "tasks/data/tables.py",
        '.fill_null("")',
        '.fill_null("south")',
        "tests/data/test_documented_data.py::"
        "test_a_blank_text_cell_is_the_empty_string_a_value_like_any_other",
    ),
    _p(
        "the image models on a uint8 `.npz`",
        "tasks/train/models.py",
        'layers.Rescaling(1 / 255.0, name="to_unit_range")',
        'layers.Rescaling(1.0, name="to_unit_range")',
        "tests/data/test_documented_data.py::"
        "test_the_image_models_train_on_a_uint8_npz_of_images_with_class_labels",
    ),
    _p(
        "`prepare.label` `--label`",
        "tasks/data/tables.py",
        '    named = [name.strip() for name in cfg.label.split(",")]\n',
        '    cfg = __import__("dataclasses").replace(cfg, label="label")\n'
        '    named = [name.strip() for name in cfg.label.split(",")]\n',
        "tests/data/test_user_data.py::"
        "test_a_table_keeps_every_column_and_row_split_stratified_with_its_statistics",
    ),
    _p(  # the statistics a built-in model standardises by, over both splits
        "`--dataset` a `.csv` or `.parquet` table",
        "tasks/data/shards.py",
        '    train = [s.sums for s in shards if s.split == "train" and s.sums]',
        "    train = [s.sums for s in shards if s.sums]",
        "tests/data/test_user_data.py::"
        "test_a_table_keeps_every_column_and_row_split_stratified_with_its_statistics",
    ),
    _p(
        "`--dataset` an image folder",
        "tasks/data/datasets.py",
        "        classes = sorted({c.name for s in split_dirs for c in _subfolders(s)})",
        "        classes = sorted({c.name for s in split_dirs for c in _subfolders(s)}, "
        "reverse=True)",
        SHARDS + "test_image_folder_round_trip",
    ),
    _p(
        "`--target-metric loss`, or one of Keras's metrics by name",
        "tasks/train/objectives.py",
        "    return name in _LOWER_SHORT or any(word in name for word in _LOWER)",
        "    return name in _LOWER_SHORT",
        "tests/train/test_documented_targets.py::"
        "test_the_target_metric_loss_or_one_of_keras_by_name_is_measured_on_the_held_out_split",
    ),
    _p(
        "`train.noise_scale` `--noise-scale`",
        "tasks/train/training.py",
        "    if not cfg.noise_scale or not choice.spec.records_noise:\n        return None\n",
        "    if not choice.spec.records_noise:\n        return None\n",
        "tests/train/test_gradient_noise.py::"
        "test_a_training_records_a_window_at_each_evaluation_and_plain_steps_after",
    ),
    _p(  # every graph call records, whatever the key says
        "`train.noise_scale_every`",
        "tasks/train/training.py",
        "        setup.step_examples, cfg.noise_scale_every,\n",
        "        setup.step_examples, 1,\n",
        "tests/train/test_gradient_noise.py::"
        "test_a_training_records_a_window_at_each_evaluation_and_plain_steps_after",
    ),
    _p(  # the key read in the wrong unit: ten times the warm-up asked for
        "`train.warmup_epochs` `--warmup-epochs`",
        "tasks/train/training.py",
        "make_warmup_schedule(base, value, cfg.warmup_epochs * steps, gain)",
        "make_warmup_schedule(base, value, cfg.warmup_epochs * 10 * steps, gain)",
        "tests/train/test_gradient_noise.py::"
        "test_an_adascale_training_sets_its_rate_from_the_noise_scale_it_measures",
    ),
    _p(
        "`sweep.strategy` `--strategy`",
        "tasks/execute/sweep_cells.py",
        "    if s.link_gbit and not kind_of(s.strategy).takes_workers:",
        '    if s.link_gbit and not kind_of("multi_worker").takes_workers:',
        "tests/report/test_sweep.py::test_links_need_worker_processes",
    ),
    _p(  # a sigmoid forgotten: its probabilities read as logits
        "an uncompiled model ending in softmax or sigmoid",
        "tasks/train/user_models.py",
        '    return getattr(activation, "__name__", "") in ("softmax", "sigmoid")',
        '    return getattr(activation, "__name__", "") in ("softmax",)',
        "tests/train/test_documented_models.py::"
        "test_an_uncompiled_model_ending_in_softmax_or_sigmoid_is_trained_on_its_probabilities",
    ),
    _p(
        "`train.callbacks` `--callbacks`",
        "tasks/train/training.py",
        "        callbacks.configured(model, cfg.callbacks)",
        '        callbacks.configured(model, "")',
        "tests/train/test_callbacks.py::"
        "test_a_built_in_model_trains_with_the_callbacks_the_config_names",
    ),
    _p(
        "`tfscale --verbose`",
        "flows/cli.py",
        "    set_up_process(args.verbose or None)",
        "    set_up_process(None)",
        "tests/flows/test_documented_features.py::"
        "test_verbose_shows_every_librarys_log_lines_and_quiet_keeps_them_off",
    ),
    _p(
        "`train.loop` `--loop`",
        "tasks/train/training.py",
        '    if cfg.loop == "fit":\n        return _train_with_fit(run, setup)\n',
        "    if False:\n        return _train_with_fit(run, setup)\n",
        "tests/train/test_fit_loop.py::"
        "test_the_fit_loop_trains_with_kerass_fit_and_records_its_epochs",
    ),
    _p(  # the recorded evaluation never read back: TensorFlow imported, evaluated again
        "`tfscale evaluate` without TensorFlow",
        "tasks/train/evaluation.py",
        "    if result is not None:\n        return result, True\n",
        "    if False:\n        return result, True\n",
        "tests/flows/test_documented_features.py::"
        "test_evaluate_reads_a_recorded_evaluation_back_without_tensorflow",
    ),
    _p(
        "`--model package.module:function`",
        "tasks/core/user_code.py",
        "    if str(Path.cwd()) not in sys.path:\n        sys.path.insert(0, str(Path.cwd()))\n",
        "    if False:\n        sys.path.insert(0, str(Path.cwd()))\n",
        "tests/train/test_documented_models.py::"
        "test_a_model_named_as_package_module_function_is_imported_from_where_tfscale_runs",
    ),
    _p(  # the file's architecture kept, its weights initialised afresh
        "`--model` a saved `.keras` file",
        "tasks/train/user_models.py",
        "        return keras.models.load_model(path)\n",
        "        return keras.models.clone_model(keras.models.load_model(path))\n",
        "tests/train/test_documented_models.py::"
        "test_a_saved_keras_file_starts_from_its_saved_weights",
    ),
    _p(  # the built-in's module checked, whatever prepare.files names
        "`prepare.files`",
        "flows/cli.py",
        '"prepare.dataset", config.prepare.files, "prepare.files"',
        '"prepare.dataset", "tasks/data/datasets.py", "prepare.files"',
        "tests/train/test_user_models.py::"
        "test_dvcs_stages_depend_on_the_users_files_and_refuse_one_outside_them",
    ),
    _p(
        "`train.files`",
        "flows/cli.py",
        'check_dvc_dep(config.train.model, "train.model", config.train.files, "train.files")',
        'check_dvc_dep(config.train.model, "train.model", "tasks/train/models.py", "train.files")',
        "tests/train/test_user_models.py::"
        "test_dvcs_stages_depend_on_the_users_files_and_refuse_one_outside_them",
    ),
    _p(
        "`train.device_memory_mb` `--device-memory-mb`",
        "tasks/train/stage_plan.py",
        "    budget = int(choice.device_memory_mb * MB)\n",
        "    budget = 0\n",
        "tests/train/test_stages.py::"
        "test_auto_cuts_a_model_too_large_for_a_device_into_the_fewest_stages_that_fit",
    ),
    _p(
        "a pipeline cut on data of several features",
        "tasks/train/stage_plan.py",
        "    if choice.spec.splits and len(manifest.spec.features) > 1:",
        "    if choice.spec.splits and len(manifest.spec.features) > 2:",
        "tests/train/test_documented_models.py::"
        "test_data_of_several_features_is_refused_for_a_pipeline_cut",
    ),
    _p(
        "a pipeline or column cut of a model with its own `train_step` or `compute_loss`",
        "tasks/train/user_models.py",
        "    if choice.spec.splits and (lost := not_cut_as_it_means(model)):",
        "    if False and (lost := not_cut_as_it_means(model)):",
        "tests/train/test_documented_models.py::"
        "test_a_cut_is_refused_where_it_would_lose_the_models_own_training",
    ),
    _p(
        "`tfscale forecast --link-gbit`",
        "tasks/report/forecast.py",
        "        if rate <= 0:\n            raise ForecastError(",
        "        if False:\n            raise ForecastError(",
        "tests/report/test_forecast.py::test_bad_forecast_input_is_one_line_naming_the_fix",
    ),
    _p(  # resnet built as the cnn
        "`--model mlp`, `cnn`, `resnet`, `embedding`",
        "tasks/train/models.py",
        '    "resnet": _resnet,\n',
        '    "resnet": _cnn,\n',
        "tests/train/test_stages.py::"
        "test_each_model_is_cut_where_one_tensor_crosses_and_its_stages_compose_to_it",
    ),
    _p(  # evaluated at the default batch: the training's record read back instead
        "`evaluate.batch_size` `--batch-size`",
        "flows/commands.py",
        "            config.evaluate.batch_size,\n",
        "            256,\n",
        "tests/train/test_user_models.py::"
        "test_a_model_with_a_custom_layer_is_evaluated_at_another_batch_size",
    ),
    _p(  # a verdict over 2 seeds a side, whose t has 2 degrees of freedom
        "`evaluate.seeds` `--seeds`",
        "tasks/report/target_comparison.py",
        "VERDICT_SEEDS = 3\n",
        "VERDICT_SEEDS = 2\n",
        "tests/report/test_summary.py::"
        "test_fewer_than_three_seeds_give_no_verdict_of_who_finishes_sooner",
    ),
    _p(
        "`evaluate.target_metric` `--target-metric`",
        "tasks/train/to_target.py",
        "    metric = evaluate.target_metric\n",
        '    metric = "auto"\n',
        "tests/train/test_user_models.py::"
        "test_a_table_classifier_with_adamw_and_auc_trains_to_its_auc_target",
    ),
    _p(
        "`evaluate.target` `--target`",
        "tasks/train/to_target.py",
        "    value = evaluate.target\n",
        "    value = None\n",
        "tests/train/test_user_models.py::"
        "test_a_regression_reaches_its_mean_absolute_error_target_from_above",
    ),
    _p(  # the model tried under float32, whatever precision was asked for
        "`train.precision` `--precision`",
        "tasks/train/user_models.py",
        "    keras.mixed_precision.set_global_policy(policy)\n    try:\n",
        '    keras.mixed_precision.set_global_policy("float32")\n    try:\n',
        "tests/train/test_user_models.py::"
        "test_a_precision_asked_for_that_the_model_fails_under_is_refused_naming_the_layer",
    ),
    _p(  # the store under the working directory, whatever the key names
        "`track.store_dir`",
        "tasks/track/tracking.py",
        "        return cls(track.store_dir, track.experiment, ui_url=track.ui_url)",
        '        return cls("mlflow", track.experiment, ui_url=track.ui_url)',
        "tests/report/test_forecast.py::"
        "test_the_track_keys_name_the_store_and_the_experiment_a_command_tracks_into",
    ),
    _p(
        "`track.experiment`",
        "tasks/track/tracking.py",
        "        return cls(track.store_dir, track.experiment, ui_url=track.ui_url)",
        '        return cls(track.store_dir, "tfscale", ui_url=track.ui_url)',
        "tests/report/test_forecast.py::"
        "test_the_track_keys_name_the_store_and_the_experiment_a_command_tracks_into",
    ),
    _p(  # every round run to the cap, whatever precision was aimed at
        "`train.measure_precision` `--measure-precision`",
        "tasks/measure/diagnosis.py",
        "rounds=cfg.measure_rounds, aim=cfg.measure_precision",
        "rounds=cfg.measure_rounds, aim=0.0",
        "tests/flows/test_owned_servers.py::"
        "test_two_runs_at_once_each_own_one_api_and_the_seeds_are_scored_as_mlperf",
    ),
    _p(
        "`train.measure_steps` `--measure-steps`",
        "tasks/execute/trainings.py",
        "        probe_steps = run.train.measure_steps\n",
        "        probe_steps = 30\n",
        "tests/flows/test_owned_servers.py::"
        "test_two_runs_at_once_each_own_one_api_and_the_seeds_are_scored_as_mlperf",
    ),
    _p(  # a name no source knows read as digits
        "`prepare.dataset` `--dataset`",
        "tasks/data/preparation.py",
        "    return tfds_source(cfg.dataset, cfg)\n",
        '    return NAMED_SOURCES["digits"](cfg)\n',
        SHARDS + "test_unknown_dataset_is_a_clear_error",
    ),
    _p(  # the callbacks the model's function gave dropped
        "a model function returning `model, [callbacks]`",
        "tasks/train/user_models.py",
        "        callbacks.keep(model, given[1])\n",
        "        callbacks.keep(model, [])\n",
        "tests/train/test_callbacks.py::"
        "test_the_callbacks_users_fit_calls_carry_run_in_tfscales_loop",
    ),
    _p(  # the file named by the model's name alone: other weights read the first's
        "`study(keras.Model, ...)`",
        "flows/notebook.py",
        '        path = folder / f"{model.name}-{weights_digest(model)}.keras"\n',
        '        path = folder / f"{model.name}.keras"\n',
        "tests/train/test_documented_models.py::"
        "test_study_takes_a_keras_model_saved_once_by_its_weights",
    ),
    _p(
        "`train.stop_at_target` `--stop-at-target`",
        "tasks/train/training.py",
        "        if stopped or (cfg.stop_at_target and clock.reached):",
        "        if stopped:",
        "tests/train/test_to_target.py::"
        "test_a_mirrored_training_stops_at_the_evaluation_that_reaches_the_target",
    ),
    _p(  # one replica, whatever the key asks
        "`train.replicas` `--replicas`",
        "tasks/distribute/strategy.py",
        "    replicas = spec.count_replicas(cfg.replicas, gpus, workers)",
        "    replicas = spec.count_replicas(1, gpus, workers)",
        "tests/train/test_to_target.py::"
        "test_a_mirrored_training_stops_at_the_evaluation_that_reaches_the_target",
    ),
    _p(
        "`tfscale plan --devices`",
        "flows/commands.py",
        "    result = make_plan(metrics, args.devices, name, gbit, args.target, batches, study)",
        "    result = make_plan(metrics, 8, name, gbit, args.target, batches, study)",
        "tests/flows/test_study.py::"
        "test_plan_reads_the_studys_run_and_says_what_each_figure_came_from",
    ),
    _p(
        "`tfscale plan --target`",
        "flows/commands.py",
        "    result = make_plan(metrics, args.devices, name, gbit, args.target, batches, study)",
        "    result = make_plan(metrics, args.devices, name, gbit, None, batches, study)",
        "tests/flows/test_study.py::"
        "test_plan_reads_the_studys_run_and_says_what_each_figure_came_from",
    ),
    _p(  # the run's measured link, whatever --link names
        "`tfscale plan --link`",
        "flows/commands.py",
        "    name, gbit = link_named(args.link)\n",
        '    name, gbit = link_named("measured")\n',
        "tests/flows/test_study.py::"
        "test_plan_reads_the_studys_run_and_says_what_each_figure_came_from",
    ),
    _p(  # one epoch, whatever the key asks
        "`train.epochs` `--epochs`",
        "tasks/train/training.py",
        "    for epoch in range(start_epoch, cfg.epochs):",
        "    for epoch in range(start_epoch, 1):",
        "tests/train/test_training.py::test_default_config_reaches_95_percent_on_digits",
    ),
    _p(  # the keyword settings (strategy=, epochs=, target_metric=, ...) dropped
        "`study(function, ...)`",
        "flows/notebook.py",
        "        overrides = {_dotted(name): value for name, value in settings.items()}\n",
        "        overrides = {}\n",
        "tests/train/test_user_models.py::"
        "test_one_call_in_a_notebook_gives_the_study_of_a_function_on_a_dataset",
    ),
    _p(  # a user's metric read as accuracy: a loss's target met from below
        "`tfscale plan` and the forecast on a user's metric",
        "tasks/report/plan.py",
        'aim = Target(own.get("metric", "accuracy"), target, own.get("lower_is_better", False))',
        'aim = Target("accuracy", target, False)',
        "tests/train/test_documented_targets.py::"
        "test_plan_and_forecast_price_a_run_whose_target_is_a_users_metric",
    ),
    _p(  # measured after training whatever --no-diagnose says
        "`tfscale train --no-diagnose`",
        "flows/commands.py",
        "probe_steps = 0 if args.no_diagnose else min(30, run.train.measure_steps)",
        "probe_steps = min(30, run.train.measure_steps)",
        "tests/train/test_fit_loop.py::"
        "test_the_fit_loop_trains_with_kerass_fit_and_records_its_epochs",
    ),
    _p(
        "`prepare.synthetic.height` `--image-size`",
        "tasks/data/datasets.py",
        "(s.height, s.width, s.channels)",
        "(32, s.width, s.channels)",
        "tests/data/test_shards.py::test_the_synthetic_image_size_keys_and_flag_decide_the_shape_written",
    ),
    _p(
        "`prepare.synthetic.height` `--image-size`",
        "flows/cli.py",
        '        overrides["prepare.synthetic.width"] = overrides["prepare.synthetic.height"]',
        "        pass",
        "tests/data/test_shards.py::test_the_synthetic_image_size_keys_and_flag_decide_the_shape_written",
    ),
    _p(
        "`prepare.synthetic.width`",
        "tasks/data/datasets.py",
        "(s.height, s.width, s.channels)",
        "(s.height, 32, s.channels)",
        "tests/data/test_shards.py::test_the_synthetic_image_size_keys_and_flag_decide_the_shape_written",
    ),
    _p(
        "`train.model` `--model`",
        "tasks/execute/trainings.py",
        "    ref = run.train.model\n    if not is_user_model(ref):",
        '    ref = "mlp"\n    if not is_user_model(ref):',
        "tests/train/test_user_models.py::test_a_bad_model_is_refused_in_one_line_before_anything_is_written",
    ),
    _p(
        "`--model path/to/file.py:function`",
        "tasks/core/user_code.py",
        "path = Path(module_name).resolve()",
        "path = (Path(__file__).parent / module_name).resolve()",
        "tests/train/test_user_models.py::test_a_table_classifier_with_adamw_and_auc_trains_to_its_auc_target",
    ),
    _p(
        "`--dataset` a `tf.data` function",
        "tasks/core/user_code.py",
        "path = Path(module_name).resolve()",
        "path = (Path(__file__).parent / module_name).resolve()",
        "tests/data/test_user_data.py::test_a_pipeline_that_changes_between_reads_is_refused_and_a_seeded_one_never_leaks",
    ),
    _p(
        "`--dataset` an `.npz`",
        "tasks/data/arrays.py",
        'parts = {None: ({"x": arrays["x"]}, arrays["y"])}',
        'parts = {None: ({"x": arrays["x"]}, arrays["y"][::-1])}',
        "tests/data/test_user_data.py::test_a_built_in_dense_model_trains_on_each_source_under_mirrored",
    ),
    _p(
        "`train.runs_dir` `--runs-dir`",
        "tasks/distribute/run.py",
        "return Path(self.config.train.runs_dir) / self.manifest.dataset / name",
        'return Path("runs") / self.manifest.dataset / name',
        "tests/data/test_user_data.py::test_a_built_in_dense_model_trains_on_each_source_under_mirrored",
    ),
    _p(
        "`tfscale forecast --dataset`, `tfscale plan --dataset`",
        "flows/cli.py",
        '"--dataset", dest="prepare.dataset", help="the run\'s dataset [prepare.dataset]"',
        '"--dataset", dest="prepare_dataset", help="the run\'s dataset [prepare.dataset]"',
        "tests/report/test_forecast.py::test_forecast_writes_its_table_json_and_charts",
    ),
    _p(
        "`tfscale forecast --no-track`, `tfscale plan --no-track`",
        "flows/commands.py",
        "    if not args.no_track:\n        run_id = log_forecast(",
        "    if True:\n        run_id = log_forecast(",
        "tests/report/test_forecast.py::test_forecast_writes_its_table_json_and_charts",
    ),
    _p(
        "`sweep.model` `--model`",
        "tasks/execute/sweep_cells.py",
        "model=config.sweep.model,",
        "model=config.train.model,",
        "tests/train/test_user_models.py::test_a_sweep_takes_a_users_model_as_a_built_in",
    ),
    _p(
        "`sweep.epochs` `--epochs`",
        "tasks/execute/sweep_cells.py",
        "epochs=config.sweep.epochs,",
        "epochs=config.train.epochs,",
        "tests/report/test_sweep.py::test_table_and_charts_hold_every_cell",
    ),
    _p(
        "`sweep.out_dir` `--out-dir`",
        "flows/sweep.py",
        "out_dir = Path(config.sweep.out_dir)",
        'out_dir = Path("sweep")',
        "tests/report/test_sweep.py::test_table_and_charts_hold_every_cell",
    ),
    _p(
        "`tfscale evaluate --model-path`",
        "flows/commands.py",
        'args.model_path or latest_run(config.train.runs_dir, manifest.dataset)["model_path"]',
        'latest_run(config.train.runs_dir, manifest.dataset)["model_path"]',
        "tests/flows/test_bad_input.py::test_a_user_mistake_gets_one_clear_error",
    ),
    _p(
        "`tfscale train --against-baseline`",
        "flows/commands.py",
        "    if args.against_baseline:  # the baseline it joins, named before any work",
        "    if False:  # the baseline it joins, named before any work",
        "tests/flows/test_bad_input.py::test_a_user_mistake_gets_one_clear_error",
    ),
    _p(
        "`train.link_gbit` `--link-gbit`",
        "tasks/execute/trainings.py",
        "    if link is not None and several and other:",
        "    if False:",
        "tests/flows/test_bad_input.py::test_a_user_mistake_gets_one_clear_error",
    ),
    _p(
        "`tfscale evaluate --baseline`",
        "flows/commands.py",
        "    if args.baseline:  # the baseline it compares with, named before any work",
        "    if False:  # the baseline it compares with, named before any work",
        "tests/flows/test_bad_input.py::test_a_user_mistake_gets_one_clear_error",
    ),
    _p(
        "`--dataset` a TFDS name",
        "tasks/data/tfds_source.py",
        'builder = tfds.builder(name, data_dir=os.environ.get("TFDS_DATA_DIR"))',
        'builder = tfds.builder("fashion_mnist", data_dir=os.environ.get("TFDS_DATA_DIR"))',
        "tests/data/test_shards.py::test_tfds_by_name_with_the_download_mocked",
    ),
    _p(
        "`tfscale serve --cron`",
        "flows/deployments.py",
        "            cron=cron,",
        "            cron=NIGHTLY_CRON,",
        "tests/flows/test_schedules.py::test_nightly_deployments_default_to_two_in_the_morning",
    ),
    _p(
        "`tfscale ui --host`, `tfscale ui --port`",
        "flows/commands.py",
        "port = args.port or configured.port or 5000",
        "port = configured.port or 5000",
        "tests/flows/test_owned_servers.py::test_tfscale_ui_links_where_a_browser_reaches_it_and_a_stop_takes_its_server",
    ),
    _p(
        "`cluster.chief_wait_s`",
        "flows/commands.py",
        "cluster.serve_task(report.cluster, config.cluster.chief_wait_s)",
        "cluster.serve_task(report.cluster, 2.0)",
        "tests/flows/test_bad_input.py::test_a_user_mistake_gets_one_clear_error",
    ),
    _p(
        "`study(function, DataFrame, label=...)`",
        "flows/notebook.py",
        "overrides = {_dotted(name): value for name, value in settings.items()}",
        'overrides = {_dotted(name): value for name, value in settings.items() if name != "label"}',
        "tests/train/test_user_models.py::test_one_call_in_a_notebook_takes_a_dataframe_with_a_text_column",
    ),
    _p(
        "a user's model in a TF_CONFIG cluster task",
        "tasks/execute/trainings.py",
        "lambda: model_for_data(run.train.model, manifest.spec, ps_tasks).model,",
        'lambda: model_for_data("mlp", manifest.spec, ps_tasks).model,',
        "tests/train/test_documented_models.py::test_a_tf_config_task_trains_and_evaluates_the_users_model",
    ),
    _p(
        "`train.cut_after`",
        "tasks/distribute/strategy.py",
        "tuple(cfg.cut_after) if spec.staged else (),",
        "(),",
        "tests/train/test_stages.py::test_the_diagnosis_prints_the_bubble_beside_the_schedule_and_names_an_uneven_cut",
    ),
    _p(  # the flag itself: without it dvc repro's train stage fails (test_dvc's fixture)
        "`tfscale train --export-dir`",
        "tasks/execute/run_files.py",
        'for name in (TRACKED_AS, "diagnosis.json", RECORDED):',
        'for name in (TRACKED_AS, "diagnosis.json"):',
        "tests/flows/test_documented_features.py::"
        "test_an_exported_model_keeps_its_recorded_evaluation_and_drops_a_stale_one",
    ),
    _p(
        "`tfscale train --baseline`",
        "flows/commands.py",
        "    if args.baseline:\n"
        "        planned = planned.with_choice(baseline_choice(planned.choice))",
        "    if False:\n        planned = planned.with_choice(baseline_choice(planned.choice))",
        "tests/flows/test_dvc.py::test_metrics_show_the_speedup_efficiency_and_accuracy",
    ),
    _p(
        "`sweep.link_gbit`",
        "tasks/execute/sweep_cells.py",
        "link_gbit=cell.link_gbit if multi else None,",
        "link_gbit=None,",
        "tests/report/test_sweep.py::test_sweep_over_emulated_links_checks_the_forecast",
    ),
    _p(
        "`sweep.work_pool` `--pool`",
        "flows/sweep.py",
        "        if config.sweep.work_pool:\n            prepared = [",
        "        if False:\n            prepared = [",
        "tests/flows/test_pool.py::test_a_pool_sweep_stops_with_no_live_worker_and_retries_the_cell_of_a_dead_host",
    ),
    _p(
        "`sweep.cell_retries`",
        "flows/sweep.py",
        "        config.sweep.cell_retries,\n    )",
        "        0,\n    )",
        "tests/flows/test_pool.py::test_a_pool_sweep_stops_with_no_live_worker_and_retries_the_cell_of_a_dead_host",
    ),
)

# rows no plant covers yet: each a gap to close (a plant, and a test that catches it)
UNPLANTED: tuple[str, ...] = (
    # the collective timeout's value changes nothing the fault tests see: a plant fixing it
    # at 60 s survived (a killed or cut-off peer fails the others sooner by other means);
    # a peer that stops without dying (SIGSTOP) is the case only the timeout ends
    "`cluster.collective_timeout_s` `--collective-timeout`",
)


@dataclass(frozen=True)
class Outcome:
    plant: Plant
    result: str  # caught, survived, no longer applies, or what else pytest said
    seconds: float


def problem(plant: Plant, root: Path = ROOT) -> str | None:
    """Why `plant` no longer applies to the code under `root`, or None where it does."""
    path = root / plant.file
    if not path.is_file():
        return f"{plant.file} is gone"
    found = path.read_text().count(plant.old)
    return None if found == 1 else f"its text is in {plant.file} {found} times, not once"


@contextlib.contextmanager
def planted(plant: Plant, root: Path = ROOT) -> Iterator[None]:
    """The file with `plant` in it, put back as it was (bytes and times) at the end,
    whatever ends it: an error, Ctrl-C, or SIGTERM (raised here as KeyboardInterrupt)."""
    path = root / plant.file
    original, times = path.read_bytes(), path.stat()
    previous = signal.getsignal(signal.SIGTERM)

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        path.write_text(original.decode().replace(plant.old, plant.new, 1))
        yield
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
        signal.signal(signal.SIGTERM, previous)


def run(plant: Plant, root: Path = ROOT) -> Outcome:
    """`plant` applied under `root` and its tests run in one pytest process."""
    why = problem(plant, root)
    if why:
        return Outcome(plant, f"no longer applies: {why}", 0.0)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n0", "-p", "no:cacheprovider"]
    command += ["-o", "addopts=", "-rfE", *plant.tests]
    start = time.monotonic()
    with planted(plant, root):
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    said = done.stdout.splitlines()
    failed = tuple(line.split()[1] for line in said if line.startswith("FAILED "))
    if done.returncode == 0:
        result = "survived"
    # an error's summary line names its test (a captured log line may begin "ERROR " too)
    elif done.returncode == 1 and failed and not any(s.startswith("ERROR tests/") for s in said):
        result = "caught"
    else:  # an error outside the tests' own assertions (set-up, teardown, collection)
        result = f"error: pytest exit {done.returncode}: {' / '.join(said[-3:])}"
    return Outcome(plant, result, seconds)


HEADER = f"{'row':<52} {'file':<30} {'result':<10} {'s':>5}"


def line(o: Outcome) -> str:
    """A plant's line of the table: its row, its file, what happened, its time."""
    row = o.plant.row if len(o.plant.row) <= 52 else o.plant.row[:49] + "..."
    result = o.result if len(o.result) <= 10 else o.result.split(":")[0]
    return f"{row:<52} {o.plant.file:<30} {result:<10} {o.seconds:>5.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", action="append", help="the plants of rows holding this text")
    parser.add_argument("--list", action="store_true", help="list the plants and unplanted rows")
    args = parser.parse_args(argv)
    chosen = [p for p in PLANTS if not args.row or any(r in p.row for r in args.row)]
    if args.list:
        for p in chosen:
            print(f"{p.row}  {p.file}: {p.old.strip()!r} -> {p.new.strip()!r}")
        print(f"{len(chosen)} plants; rows without one: {len(UNPLANTED)}")
        print("\n".join(f"  {row}" for row in UNPLANTED))
        return 0
    outcomes, start = [], time.monotonic()
    print(HEADER, flush=True)
    try:
        for plant in chosen:
            outcomes.append(run(plant))
            print(line(outcomes[-1]), flush=True)
    except KeyboardInterrupt:
        print("stopped: the planted file is back as it was", file=sys.stderr)
        return 130
    caught = sum(o.result == "caught" for o in outcomes)
    rows = len({o.plant.row for o in outcomes})
    print(
        f"\n{caught} of {len(outcomes)} plants caught, over {rows} rows, in "
        f"{time.monotonic() - start:.0f} s"
    )
    for o in outcomes:
        if o.result != "caught":
            print(f"  {o.result}: {o.plant.row} ({o.plant.file})")
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
