// The subcommands of the `moeshard` binary. Each takes its arguments (after the
// subcommand name) and returns the process exit code; errors are printed to stderr.
#pragma once

#include <string>
#include <vector>

namespace moeshard {

int GenerateCommand(const std::vector<std::string>& args);
int CheckCommand(const std::vector<std::string>& args);
int MakeModelCommand(const std::vector<std::string>& args);
int EvalCommand(const std::vector<std::string>& args);
int BenchModelCommand(const std::vector<std::string>& args);

// Commands that need the cluster (gRPC, HTTP). A core-only build links an empty table.
struct ClusterCommand {
  const char* name;
  const char* help;
  int (*run)(const std::vector<std::string>& args);
};
const std::vector<ClusterCommand>& ClusterCommands();
int UpCommand(const std::vector<std::string>& args);

}  // namespace moeshard
