// The reducer's hook: an iteration's figures into the process's series while counting.
#include <corodist/metrics/reducer_metrics.hpp>

#include "metrics/process_metrics.hpp"

namespace corodist::metrics {

void note_reducer_iteration(const reducer_iteration& it) noexcept {
  if (counting())
    detail::process_metrics::instance().on_reducer(it);
}

} // namespace corodist::metrics
