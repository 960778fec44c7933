// Continuous-batching scheduler of one coordinator: decides, step by step, which tokens of
// which sequences the workers run.
//
// A sequence holds tokens = prompt + generated and num_computed, the number of leading tokens
// whose KV the workers have written (or the prefix cache supplied). Every step runs, per chosen
// sequence, one chunk: the next tokens [num_computed, num_computed + n). A chunk that reaches
// the end of the tokens samples the next one ("sample"): a decode step is a chunk of one token.
//
// Schedule() builds a step within max_tokens_per_step tokens:
//   1. decodes first: running sequences with one pending token, in admission order. If one
//      needs a block and none is free, the most recently admitted running sequence that is not
//      in flight is preempted (blocks freed, sent to the front of the waiting queue with its
//      generated tokens kept, recomputed later as prompt + generated) until it fits; if no
//      sequence can be preempted it waits for in-flight steps to release blocks;
//   2. then running sequences part-way through their prompt (chunked prefill); when the sliding
//      pool (models with sliding-window layers) cannot hold a chunk, a smaller one, else the
//      newest preemptible sequence is preempted as for decodes;
//   3. then waiting sequences in FIFO order, while max_num_seqs and the blocks allow (their
//      full blocks are all reserved at admission; the prefix cache may cover part of the prompt;
//      sliding-pool blocks are reserved chunk by chunk, each step releasing those its window left).
//      Nothing is admitted in a step that had to preempt or wait for blocks.
// Several steps may be in flight at once (pipeline micro-batches): Schedule() only picks
// sequences not in flight, so the steps it returns before OnStepDone() are disjoint, except
// for lookahead.
//
// Lookahead (Schedule(true), for a worker that embeds the tokens it samples: one worker holding
// the whole model): a running sequence whose one in-flight chunk samples its next token gets a
// decode chunk for that token in the next step before the token is known ("follow": the
// worker puts in the token it sampled for the sequence in the step before). The workers run
// steps in order, so the GPU starts step n+1 as soon as step n's token is drawn instead of
// after the round trip through the coordinator. Not planned when the in-flight token is the
// sequence's last by length (max_new_tokens, max_model_len, the pool); when it turns out to be a
// stop token the lookahead's result is dropped (the sequence has finished; its blocks were
// freed as it finished: any step planned later runs after the lookahead on every worker). A
// lookahead never preempts. OnStepDone() must see the steps in step order.
//
// Finishing: a sampled stop token ("stop"), or "length" at max_new_tokens, at max_model_len
// tokens, or when the whole KV pool could not hold one more position for the sequence.
//
// Not thread-safe: one control thread calls every method. Does not own the BlockManager.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/block_manager.h"
#include "common/sampling/sampling_params.h"

namespace moeshard {

struct SeqRequest {
  int64_t seq_id = 0;
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 0;            // >= 1
  std::vector<int32_t> stop_token_ids;   // always stop
  std::vector<int32_t> eos_token_ids;    // stop unless ignore_eos
  bool ignore_eos = false;
  SamplingParams sampling;
  int32_t top_logprobs = 0;
  bool logprobs = false;
};

struct SchedulerConfig {
  int64_t max_num_seqs = 64;          // running (admitted) sequences at most
  int64_t max_tokens_per_step = 512;  // tokens in one step; >= max_num_seqs so decodes always fit
  int64_t max_model_len = 4096;       // prompt + generated tokens at most

  absl::Status Validate() const;
};

struct ChunkPlan {
  int64_t seq_id = 0;
  int64_t start_pos = 0;              // position of tokens[0]
  std::vector<int32_t> tokens;        // the token ids to run (the first stage embeds them)
  std::vector<int32_t> block_table;   // the sequence's whole table, covering start_pos + size
  std::vector<int32_t> sliding_table; // with a sliding pool: its table there (-1 before the window)
  std::vector<int32_t> cached_prefix; // first chunk after a prefix-cache hit: the cached tokens
  bool sample = false;                // last chunk of the prompt, or a decode step
  // Lookahead: a one-token decode whose token is the one the step before samples for this
  // sequence (unknown when planned: tokens = {-1}); the worker puts it in.
  bool follow = false;
  // For the last stage (meaningful when sample):
  SamplingParams sampling;
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

struct StepPlan {
  int64_t step_id = 0;
  std::vector<ChunkPlan> chunks;
  std::vector<int64_t> preempted;  // sequences preempted to make room for this step (also reported
                                   // as events by the next OnStepDone)
  int64_t num_tokens() const;
};

// What happened to one sequence. One step may give several events for a sequence (e.g. a
// preemption reported by a later OnStepDone, then a token).
struct SeqEvent {
  int64_t seq_id = 0;
  std::optional<int32_t> token;   // a newly sampled token
  bool is_stop_token = false;     // the token is a stop/EOS token: report it, emit no text for it
  bool finished = false;
  std::string finish_reason;      // when finished: "stop" (stop/EOS token) or "length" (max_new_tokens,
                                  // max_model_len, or a sequence the whole KV pool cannot grow)
  int64_t num_cached_tokens = -1; // prompt tokens served by the prefix cache; >= 0 only on the
                                  // event of the request's first scheduled step
  bool preempted = false;         // blocks were taken back; it will be recomputed
};

class Scheduler {
 public:
  // `blocks` must outlive the scheduler; the config must pass Validate() (otherwise Add fails).
  Scheduler(SchedulerConfig config, BlockManager* blocks);

  // Queues a request. InvalidArgument for an empty prompt, max_new_tokens < 1, bad sampling
  // parameters, a prompt longer than max_model_len or larger than the whole KV pool;
  // AlreadyExists for a seq_id that is queued or running.
  absl::Status Add(SeqRequest request);
  // Drops a request: its blocks are freed now, or when its in-flight step completes (that
  // step's results are then ignored). No further event is reported for it. Unknown ids are
  // ignored.
  void Abort(int64_t seq_id);

  // The next step, from sequences not already in flight (and with `lookahead`, lookahead
  // decodes of sequences whose in-flight chunk samples); nullopt when nothing can run now.
  std::optional<StepPlan> Schedule(bool lookahead = false);
  // Records a finished step: sampled holds (seq_id, token) for its chunks with sample set. A
  // sampled chunk missing from it is retried (its last token runs again next time). Returns the
  // events of this step and any preemptions since the last call. Unknown steps are ignored. A
  // chunk that no longer starts where its sequence's computed tokens end (a lookahead whose
  // token did not come) is dropped.
  std::vector<SeqEvent> OnStepDone(const StepPlan& step, const std::vector<std::pair<int64_t, int32_t>>& sampled);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_in_flight_steps() const { return static_cast<int64_t>(in_flight_steps_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  bool HasWork() const { return !running_.empty() || !waiting_.empty(); }

  // Checks the scheduler's invariants and the block manager's (for tests).
  absl::Status CheckIntegrity() const;

 private:
  struct Seq {
    SeqRequest req;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t num_computed = 0;
    bool running = false;         // holds blocks (admitted)
    int in_flight = 0;            // steps in flight with a chunk of it (2: a chunk and its lookahead)
    bool samples_in_flight = false;  // its newest in-flight chunk samples the next token
    bool aborted = false;         // free once its in-flight step completes
    bool scheduled_once = false;
    int64_t cached_to_report = -1;
    int64_t num_generated() const { return static_cast<int64_t>(tokens.size() - req.prompt.size()); }
  };

  ChunkPlan MakeChunk(Seq& seq, int64_t n);
  // Whether the token `s`'s in-flight chunk samples leaves room for one more (by length).
  bool CanLookAhead(const Seq& s) const;
  // Frees a block for `seq_id` by preempting the newest preemptible running sequence.
  bool PreemptFor(int64_t seq_id, const std::unordered_set<int64_t>& in_step, StepPlan* step);
  void Preempt(int64_t seq_id, StepPlan* step);
  void Finish(int64_t seq_id);  // frees blocks and forgets the sequence
  bool IsStop(const Seq& seq, int32_t token, bool* is_stop_token) const;

  SchedulerConfig config_;
  absl::Status config_status_;
  BlockManager* blocks_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::vector<int64_t> running_;  // admission order
  std::deque<int64_t> waiting_;
  std::unordered_set<int64_t> in_flight_steps_;
  std::vector<SeqEvent> pending_events_;
  int64_t next_step_id_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace moeshard
