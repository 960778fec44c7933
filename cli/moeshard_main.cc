// The `moeshard` command: dispatches to a subcommand.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) {
  using namespace moeshard;
  const char* usage =
      "usage: moeshard <command> [flags]\n"
      "  generate     run a model in this process and stream a continuation\n"
      "  check        compare a model with a goldens file\n"
      "  make-model   write a model with random weights\n"
      "  eval         perplexity of a model on a text file\n"
      "  bench-model  prefill and decode throughput of a random-weight model on a GPU\n";
  std::string all = usage;
  for (const auto& c : ClusterCommands()) all += std::string("  ") + c.name + std::string(13 - std::strlen(c.name), ' ') + c.help + "\n";
  all += "Run `moeshard <command> --help` for its flags.\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    std::fputs(all.c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "generate") return GenerateCommand(args);
  if (cmd == "check") return CheckCommand(args);
  if (cmd == "make-model") return MakeModelCommand(args);
  if (cmd == "eval") return EvalCommand(args);
  if (cmd == "bench-model") return BenchModelCommand(args);
  for (const auto& c : ClusterCommands()) {
    if (cmd == c.name) return c.run(args);
  }
  std::fprintf(stderr, "moeshard: unknown command '%s'\n%s", cmd.c_str(), all.c_str());
  return 2;
}
