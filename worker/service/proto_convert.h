// Moved to proto/proto_convert.h. This forward exists only for coordinator/engine.cc, which the
// `engine` branch rewrites (scripts/layers_allowlist.txt): delete it when that branch merges.
#pragma once

#include "proto/proto_convert.h"
