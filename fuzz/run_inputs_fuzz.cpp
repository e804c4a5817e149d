// libFuzzer target: the whole input path of `tilemoe run` - the options that shape the layer,
// an --inputs file and a --weights file - as prepare_step takes it, followed by the dense
// reference on what it prepared. The contract: whatever the bytes, the answer is a prepared
// step or a tilemoe::Error of kind BadInput. Any other exception, a crash or a sanitizer report
// (an overread when the files and the options disagree, say) is a bug.
//
// One fuzz input is: a flags byte, a 16-bit little-endian length n, n bytes of the inputs file,
// and the rest, the weights file. The flags choose which options are given (and so which
// dimensions the files must agree with) and which file is present.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "step_options.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/reference.hpp"

namespace {

// The two files of every input, at fixed paths of this process, removed when it exits.
struct FuzzFiles {
  std::string inputs = path("inputs"), weights = path("weights");
  static std::string path(const char* name) {
    return (std::filesystem::temp_directory_path() / ("tilemoe_run_inputs_fuzz_" + std::to_string(::getpid()) + "_" + name)).string();
  }
  ~FuzzFiles() {
    std::error_code ignored;
    std::filesystem::remove(inputs, ignored);
    std::filesystem::remove(weights, ignored);
  }
};
FuzzFiles files;

const std::string& write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::uint8_t flags = data[0];
  const std::size_t inputs_size = std::min<std::size_t>(data[1] | (std::size_t{data[2]} << 8), size - 3);
  const std::string& inputs = write_file(files.inputs, data + 3, inputs_size);
  const std::string& weights = write_file(files.weights, data + 3 + inputs_size, size - 3 - inputs_size);

  std::vector<std::string> args = {"run"};
  if (flags & 0x01) args.insert(args.end(), {"--inputs", inputs});
  if (flags & 0x02) args.insert(args.end(), {"--weights", weights});
  if (flags & 0x04) args.insert(args.end(), {"--hidden", "8"});
  if (flags & 0x08) args.insert(args.end(), {"--experts", "2"});
  if (flags & 0x10) args.insert(args.end(), {"--ffn-hidden", "8"});
  if (flags & 0x20) args.insert(args.end(), {"--activation", "gelu"});
  if (flags & 0x40) args.insert(args.end(), {"--dtype", "fp32"});
  // --max-memory 4M refuses the embedded default's widths (21 MiB of weights), which neither
  // file shapes: drawing them under the sanitizers took seconds an input and made a fixed run
  // count outlive the test's timeout, for no path the files reach.
  args.insert(args.end(), {"--ranks", (flags & 0x80) ? "2" : "1", "--top-k", "1", "--tokens", "3", "--max-memory", "4M"});

  // A fresh parser per input: CLI11 options remember what the last parse gave them.
  CLI::App app;
  tilemoe::cli::StepOptions options;
  CLI::App* run = app.add_subcommand("run");
  options.add_to(*run);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
    const tilemoe::cli::PreparedStep step = tilemoe::cli::prepare_step(options);
    const auto dense = tilemoe::dense_reference(step.world, step.inputs, step.routing, step.weights);
    if (dense.size() != step.inputs.size()) std::abort();
  } catch (const CLI::ParseError&) {
    std::abort();  // the harness builds only valid command lines
  } catch (const tilemoe::Error& error) {
    if (error.kind() != tilemoe::ErrorKind::BadInput) std::abort();
  }
  return 0;
}
