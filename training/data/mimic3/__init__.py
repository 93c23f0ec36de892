"""Raw MIMIC-III tables -> the mimic3-benchmarks layout, out of core (DuckDB).

The steps are those of the benchmark's scripts, in order: `extract_subjects` (stays, diagnoses,
events per subject), `validate_events`, `extract_episodes_from_subjects`, `split_train_and_test`,
`create_in_hospital_mortality`, `create_phenotyping` and `split_train_val`. `pipeline.extract`
runs them all; docs/mimic.md says where and why the output differs from the reference.
"""
