#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "te/log.h"

namespace te {
namespace {

std::mutex g_mutex;
te_log_handler g_handler = nullptr;
void* g_user = nullptr;

int32_t env_level() {
  static const int32_t level = [] {
    const char* v = std::getenv("TE_LOG_LEVEL");
    if (v == nullptr) return static_cast<int32_t>(TE_LOG_WARNING);
    if (std::strcmp(v, "debug") == 0 || std::strcmp(v, "DEBUG") == 0) return static_cast<int32_t>(TE_LOG_DEBUG);
    if (std::strcmp(v, "info") == 0 || std::strcmp(v, "INFO") == 0) return static_cast<int32_t>(TE_LOG_INFO);
    if (std::strcmp(v, "error") == 0 || std::strcmp(v, "ERROR") == 0) return static_cast<int32_t>(TE_LOG_ERROR);
    return static_cast<int32_t>(TE_LOG_WARNING);
  }();
  return level;
}

}  // namespace

bool log_key_is_new(const std::string& key) {
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(g_mutex);
  return seen.insert(key).second;
}

void log_info(const std::string& message) {
  te_log_handler handler;
  void* user;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    handler = g_handler;
    user = g_user;
  }
  if (handler != nullptr) {
    handler(TE_LOG_INFO, message.c_str(), user);
  } else if (env_level() <= TE_LOG_INFO) {
    std::fprintf(stderr, "[te INFO] %s\n", message.c_str());
  }
}

}  // namespace te

extern "C" void te_set_log_handler(te_log_handler handler, void* user_data) {
  std::lock_guard<std::mutex> lock(te::g_mutex);
  te::g_handler = handler;
  te::g_user = user_data;
}
