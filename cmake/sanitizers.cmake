# CUBEVEC_SANITIZE applies to every target: a sanitizer needs the whole program instrumented.
if(CUBEVEC_SANITIZE)
  message(STATUS "cubevec: building with -fsanitize=${CUBEVEC_SANITIZE}")
  add_compile_options(-fsanitize=${CUBEVEC_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${CUBEVEC_SANITIZE})
endif()
