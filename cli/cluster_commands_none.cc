// The command table of a core-only build (MOESHARD_ONLY_CORE): no cluster commands.
#include "cli/commands.h"

namespace moeshard {

const std::vector<ClusterCommand>& ClusterCommands() {
  static const std::vector<ClusterCommand> none;
  return none;
}

}  // namespace moeshard
