// librmmd_c's errors and versions: the thread's last message, the status of
// an exception (DESIGN.md's error table), and the library's version.

#include "client/c_api/c_internal.hpp"

#include <rmmd/error.hpp>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

static_assert(RMMD_VERSION == RMMD_PROJECT_VERSION_NUMBER,
              "include/rmmd/rmmd.h's RMMD_VERSION_* differ from the CMake project's version");

namespace rmmd::c_api {
namespace {

thread_local std::string last_error;

/// `what` without the C++ type names rmm::bad_alloc and rmm::out_of_memory
/// put before the message ("std::bad_alloc: out_of_memory: rmmd: ..."): the
/// status already says which it is.
std::string words(char const* what)
{
  std::string_view text(what);
  for (std::string_view prefix : {"std::bad_alloc: ", "out_of_memory: "}) {
    if (text.substr(0, prefix.size()) == prefix) { text.remove_prefix(prefix.size()); }
  }
  return std::string(text);
}

}  // namespace

rmmd_status fail(rmmd_status status, std::string message)
{
  last_error = std::move(message);
  return status;
}

rmmd_status from_exception() noexcept
{
  try {
    throw;
  } catch (rmmd::not_found_error const& e) {
    return fail(RMMD_ERROR_NOT_FOUND, e.what());
  } catch (rmmd::already_exists_error const& e) {
    return fail(RMMD_ERROR_ALREADY_EXISTS, e.what());
  } catch (rmmd::precondition_error const& e) {
    return fail(RMMD_ERROR_FAILED_PRECONDITION, e.what());
  } catch (rmmd::logic_error const& e) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, e.what());
  } catch (rmmd::permission_error const& e) {
    return fail(RMMD_ERROR_PERMISSION_DENIED, words(e.what()));
  } catch (rmmd::session_error const& e) {
    return fail(RMMD_ERROR_SESSION, words(e.what()));
  } catch (rmmd::deadline_error const& e) {
    return fail(RMMD_ERROR_DEADLINE_EXCEEDED, words(e.what()));
  } catch (rmm::out_of_memory const& e) {
    return fail(RMMD_ERROR_OUT_OF_MEMORY, words(e.what()));
  } catch (rmm::bad_alloc const& e) {
    // error.hpp's "anything else": a CUDA or system error, named. (It
    // derives from std::bad_alloc, which must not make it out of memory.)
    return fail(RMMD_ERROR_INTERNAL, words(e.what()));
  } catch (rmm::logic_error const& e) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, words(e.what()));
  } catch (std::logic_error const& e) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, words(e.what()));
  } catch (std::bad_alloc const& e) {
    // std::bad_alloc itself (the heap): out of memory too.
    return fail(RMMD_ERROR_OUT_OF_MEMORY, std::string("rmmd: ") + e.what());
  } catch (std::exception const& e) {
    return fail(RMMD_ERROR_INTERNAL, words(e.what()));
  } catch (...) {
    return fail(RMMD_ERROR_INTERNAL, "rmmd: an unknown exception");
  }
}

rmmd_status null_argument(char const* what)
{
  return fail(RMMD_ERROR_INVALID_ARGUMENT, std::string("rmmd: ") + what + " is NULL");
}

char* copy_string(std::string const& s)
{
  auto* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) { throw std::bad_alloc(); }
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace rmmd::c_api

extern "C" {

char const* rmmd_version(void)
{
  return RMMD_VERSION_STRING;
}

int rmmd_version_number(void)
{
  return RMMD_VERSION;
}

char const* rmmd_last_error_message(void)
{
  return rmmd::c_api::last_error.c_str();
}

char const* rmmd_status_name(rmmd_status status)
{
  switch (status) {
    case RMMD_SUCCESS:
      return "RMMD_SUCCESS";
    case RMMD_ERROR_INVALID_ARGUMENT:
      return "RMMD_ERROR_INVALID_ARGUMENT";
    case RMMD_ERROR_DEADLINE_EXCEEDED:
      return "RMMD_ERROR_DEADLINE_EXCEEDED";
    case RMMD_ERROR_NOT_FOUND:
      return "RMMD_ERROR_NOT_FOUND";
    case RMMD_ERROR_ALREADY_EXISTS:
      return "RMMD_ERROR_ALREADY_EXISTS";
    case RMMD_ERROR_PERMISSION_DENIED:
      return "RMMD_ERROR_PERMISSION_DENIED";
    case RMMD_ERROR_OUT_OF_MEMORY:
      return "RMMD_ERROR_OUT_OF_MEMORY";
    case RMMD_ERROR_FAILED_PRECONDITION:
      return "RMMD_ERROR_FAILED_PRECONDITION";
    case RMMD_ERROR_INTERNAL:
      return "RMMD_ERROR_INTERNAL";
    case RMMD_ERROR_SESSION:
      return "RMMD_ERROR_SESSION";
  }
  return "RMMD_ERROR_UNKNOWN";
}

void rmmd_string_free(char* s)
{
  std::free(s);
}

}  // extern "C"
