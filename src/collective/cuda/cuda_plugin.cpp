// Finds and loads libcorodist-cuda (the CUDA and NCCL code) on first use.
#include "collective/cuda/cuda_plugin.hpp"

#include "core/log.hpp"

#include <corodist/collective/errors.hpp>

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace corodist::collective::detail {

namespace {

struct loaded {
  const cuda_plugin* plugin = nullptr;
  std::string why;
};

// The directory libcorodist itself was loaded from: the plugin is installed
// (and built) beside it.
std::string own_directory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&load_cuda_plugin), &info) == 0 || info.dli_fname == nullptr)
    return {};
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

loaded load() {
  loaded out;
  const auto beside = own_directory() + cuda_plugin_file;
  void* handle = ::dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string first_error;
  if (handle == nullptr) {
    first_error = ::dlerror();
    handle = ::dlopen(cuda_plugin_file, RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    out.why = std::string("the CUDA plugin could not be loaded (") + first_error + ")";
    return out;
  }
  auto entry = reinterpret_cast<const cuda_plugin* (*)()>(::dlsym(handle, "corodist_cuda_plugin_v1"));
  if (entry == nullptr) {
    out.why = std::string("the CUDA plugin has no entry point: ") + ::dlerror();
    return out;
  }
  const auto* plugin = entry();
  if (plugin == nullptr || plugin->abi_version != cuda_plugin::abi) {
    out.why = "the CUDA plugin found belongs to another corodist build (ABI mismatch)";
    return out;
  }
  CORODIST_LOG_DEBUG("collective: loaded the CUDA plugin ({})", beside);
  out.plugin = plugin; // never unloaded: its code may run until the process ends
  return out;
}

} // namespace

const cuda_plugin* load_cuda_plugin(std::string& why) {
  static const loaded once = load();
  if (!once.plugin)
    why = once.why;
  return once.plugin;
}

const cuda_runtime& cuda_runtime_or_throw() {
#if !CORODIST_HAS_NCCL
  throw cuda_error("CUDA cannot be used: this corodist was built without CUDA and NCCL (needs CUDA >= 12 and NCCL, "
                   "e.g. in /usr/local/cuda; reconfigure with -Dcuda=enabled -Dnccl=enabled)");
#else
  // Once: the plugin, and whether a device is present, do not change while the process runs.
  struct usable {
    const cuda_runtime* runtime = nullptr;
    std::string why;
  };
  static const usable once = [] {
    usable u;
    const auto* plugin = load_cuda_plugin(u.why);
    if (plugin)
      u.why = plugin->unavailable_reason();
    if (plugin && u.why.empty())
      u.runtime = plugin->runtime;
    return u;
  }();
  if (!once.runtime)
    throw cuda_error("CUDA cannot be used: " + once.why);
  return *once.runtime;
#endif
}

} // namespace corodist::collective::detail
