# One warning policy for every feplb target; FEPLB_WERROR=ON (CI: .ci/run) makes them errors.
option(FEPLB_WERROR "Treat warnings of feplb's own C++ code as errors (CI)" OFF)
function(feplb_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${FEPLB_WERROR}>>:-Werror>)
endfunction()
