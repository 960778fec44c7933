// The integration suite talks to a cluster through the OpenAI client that `bench serve` shares
// (common/openai_client/); its names, as the suite's own.
#pragma once

#include "common/openai_client/http_client.h"
#include "common/openai_client/openai_api.h"

namespace moeshard::itest {

using openai_client::Auth;
using openai_client::CheckErrorBody;
using openai_client::DescribeDiff;
using openai_client::FormatIds;
using openai_client::GenRequest;
using openai_client::GenResult;
using openai_client::HttpClient;
using openai_client::HttpResponse;
using openai_client::Json;
using openai_client::MakePrompt;
using openai_client::OpenAiApi;
using openai_client::SseParser;
using openai_client::Tally;

}  // namespace moeshard::itest
