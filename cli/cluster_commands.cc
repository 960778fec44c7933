#include "cli/commands.h"

namespace moeshard {

const std::vector<ClusterCommand>& ClusterCommands() {
  static const std::vector<ClusterCommand> commands = {
      {"up", "start workers, coordinator(s) and the router on this machine", UpCommand},
  };
  return commands;
}

}  // namespace moeshard
