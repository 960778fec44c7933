// `moeshard itest`: the cluster's integration suite (cli/itest_cmd.cc).
#pragma once

#include <string>
#include <vector>

namespace moeshard {

int ItestCommand(const std::vector<std::string>& args);

}  // namespace moeshard
