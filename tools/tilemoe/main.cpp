// tilemoe: the command-line tool. Exit codes: 0 ok, 2 bad input (message on stderr),
// 1 internal error (including a check that failed or a wait that timed out).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "commands.hpp"
#ifdef TILEMOE_WITH_CUDA
#include "tilemoe/cuda/module_loading.hpp"
#endif
#include "tilemoe/error.hpp"
#include "tilemoe/staged_file.hpp"

int main(int argc, char** argv) {
#ifdef TILEMOE_WITH_CUDA
  tilemoe::cuda::prepare_cuda_environment();  // before any CUDA call: virtual ranks need it
#endif
  tilemoe::remove_staged_files_on_interrupt();  // an interrupted run leaves no temporary behind
  CLI::App app{"tilemoe: expert-parallel MoE layers with compute/communication overlap"};
  app.require_subcommand(1);
  int exit_code = 0;
  tilemoe::cli::add_run_command(app, exit_code);
  tilemoe::cli::add_validate_plan_command(app, exit_code);
  tilemoe::cli::add_bench_command(app, exit_code);
  tilemoe::cli::add_launch_command(app, exit_code);
  const std::string first = argc > 1 ? argv[1] : "";
  if (!first.empty() && first[0] != '-' && first != "run" && first != "validate-plan" && first != "bench" &&
      first != "launch") {
    std::fprintf(stderr, "tilemoe: unknown command '%s': use run, bench, validate-plan or launch (tilemoe --help lists them)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  } catch (const tilemoe::Error& error) {
    std::fprintf(stderr, "tilemoe: %s\n", error.what());
    return error.kind() == tilemoe::ErrorKind::BadInput ? 2 : 1;
  } catch (const std::bad_alloc&) {
    // The estimate (--max-memory) let through a step the machine could not hold after all
    // (other processes took memory meanwhile): the size is the user's to change, not a bug.
    std::fprintf(stderr, "tilemoe: out of memory while preparing or running the step: use fewer --tokens or smaller layer "
                         "dimensions, or set --max-memory to what this machine can really spare\n");
    return 2;
  } catch (const std::length_error& error) {
    std::fprintf(stderr, "tilemoe: a size is too large for this machine (%s): use fewer --tokens or smaller layer dimensions\n",
                 error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tilemoe: internal error: %s\n", error.what());
    return 1;
  }
  return exit_code;
}
