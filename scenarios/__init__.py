"""What to run: hardware presets and experiments (TOML), the runner, reports, plots and the CLI."""
