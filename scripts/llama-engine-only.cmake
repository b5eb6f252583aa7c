# Included after each project() of llama-cpp-python's CMake build (the Makefile passes it as CMAKE_PROJECT_INCLUDE).
# llama-cpp-python forces llama.cpp's `common` library on (a cache entry); cllm loads only libllama, libggml and
# libmtmd, so a normal variable of the same name shadows that entry and `common` and the HTTP client it pulls in
# are never compiled: about half of the build's compile time.
set(LLAMA_BUILD_COMMON OFF)
