/* The C ABI as a C program sees it from an installed rmmd-dev: built with
 * `cc -std=c11 c_consumer.c $(pkg-config --cflags --libs rmmd-c)`, no C++,
 * no RMM and no CUDA headers. Opens a session at argv[1], allocates 1 MiB of
 * the host pool, writes it, and shares a buffer with itself by name.
 * Prints "rmmd_c_consumer: ...: ok", or what failed and exits 1. */
#include <rmmd/rmmd.h>

#include <stdio.h>
#include <string.h>

static int failed(char const* what, rmmd_status status)
{
  fprintf(stderr,
          "rmmd_c_consumer: %s: %s: %s\n",
          what,
          rmmd_status_name(status),
          rmmd_last_error_message());
  return 1;
}

int main(int argc, char** argv)
{
  if (argc != 2) { return 64; }
  rmmd_session_options options;
  memset(&options, 0, sizeof(options));
  options.size           = sizeof(options);
  options.runtime_dir    = argv[1];
  options.client_name    = "rmmd_c_consumer";
  rmmd_session_t session = NULL;
  rmmd_status s          = rmmd_session_create(&options, &session);
  if (s != RMMD_SUCCESS) { return failed("session", s); }

  rmmd_resource_options ro;
  memset(&ro, 0, sizeof(ro));
  ro.size                  = sizeof(ro);
  ro.kind                  = RMMD_RESOURCE_HOST;
  rmmd_resource_t resource = NULL;
  if ((s = rmmd_resource_create(session, &ro, &resource)) != RMMD_SUCCESS) {
    return failed("host resource", s);
  }
  void* p = NULL;
  if ((s = rmmd_allocate(resource, 1 << 20, 0, NULL, &p)) != RMMD_SUCCESS) {
    return failed("allocate", s);
  }
  memset(p, 0x5a, 1 << 20);
  rmmd_deallocate(resource, p, 1 << 20, 0, NULL);

  /* A name nobody made: NOT_FOUND, said in words. */
  rmmd_buffer_t missing = NULL;
  s                     = rmmd_buffer_open(session, "c-consumer/none", 0, &missing);
  if (s != RMMD_ERROR_NOT_FOUND || strstr(rmmd_last_error_message(), "no buffer") == NULL) {
    return failed("open of a missing buffer", s);
  }

  rmmd_buffer_options bo;
  memset(&bo, 0, sizeof(bo));
  bo.size            = sizeof(bo);
  bo.pool            = "host";
  bo.device          = -1;
  rmmd_buffer_t made = NULL, opened = NULL;
  if ((s = rmmd_buffer_create(session, "c-consumer/b", 4096, &bo, &made)) != RMMD_SUCCESS) {
    return failed("create buffer", s);
  }
  void* w = NULL;
  rmmd_buffer_pointer(made, &w);
  strcpy((char*)w, "hello from C");
  if ((s = rmmd_buffer_publish(made)) != RMMD_SUCCESS) { return failed("publish", s); }
  if ((s = rmmd_buffer_open(session, "c-consumer/b", 0, &opened)) != RMMD_SUCCESS) {
    return failed("open", s);
  }
  void* r = NULL;
  rmmd_buffer_pointer(opened, &r);
  if (strcmp((char const*)r, "hello from C") != 0) {
    return failed("read back", RMMD_ERROR_INTERNAL);
  }
  rmmd_buffer_close(opened, NULL);
  rmmd_buffer_close(made, NULL);

  uint64_t id = 0;
  rmmd_session_id(session, &id);
  printf("rmmd_c_consumer: session %llu, library %s: ok\n", (unsigned long long)id, rmmd_version());
  rmmd_resource_destroy(resource);
  rmmd_session_destroy(session);
  return 0;
}
