#pragma once
#include <CLI/CLI.hpp>

namespace tilemoe::cli {

// Each adds its subcommand to the app; the callback returns the process exit code.
void add_run_command(CLI::App& app, int& exit_code);
void add_validate_plan_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_launch_command(CLI::App& app, int& exit_code);

}  // namespace tilemoe::cli
