#pragma once
// Where a launched rank learns its place (private): the variables corodist-run
// and torchrun set, else those srun sets (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, the first host of the step's or job's node list).

#include <corodist/store/errors.hpp>
#include <corodist/store/launch_generation.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace corodist::store::detail {

/// The launcher's settings as read from the environment; empty when absent.
struct launch_env {
  std::optional<std::string> rank;        ///< RANK, else SLURM_PROCID
  std::optional<std::string> world_size;  ///< WORLD_SIZE, else SLURM_NTASKS
  std::optional<std::string> local_rank;  ///< LOCAL_RANK, else SLURM_LOCALID
  std::optional<std::string> master_addr; ///< MASTER_ADDR, else the first Slurm host
  std::optional<std::string> master_port; ///< MASTER_PORT (no Slurm fallback)
  bool slurm = false;                     ///< rank and world size came from Slurm
  /// TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store, every
  /// rank (rank 0 included) connects to it as a client.
  bool use_agent_store = false;
  std::optional<std::string> generation;    ///< CORODIST_GENERATION (set by corodist-run)
  std::optional<std::string> restart_count; ///< TORCHELASTIC_RESTART_COUNT
};

// The generation's names are public (corodist-run uses them):
// <corodist/store/launch_generation.hpp>.
using corodist::store::generation_key;
using corodist::store::generation_prefix;
using corodist::store::generation_variable;

/// Reads the environment now. RANK/WORLD_SIZE fall back to Slurm's only when
/// both are absent (a half-set pair is reported as missing, not mixed).
/// Throws store_error when a Slurm node list is malformed.
launch_env read_launch_env();

/// The first host of a Slurm host list: "node[01-04,07],gpu5" -> "node01",
/// "rack[2-3]-n[8,9]" -> "rack2-n8". Validates the whole list (balanced,
/// unnested brackets; numeric items "N" or "LO-HI" with LO <= HI; no empty
/// names) and throws store_error naming the list and the fault.
std::string slurm_first_host(std::string_view nodelist);

} // namespace corodist::store::detail
