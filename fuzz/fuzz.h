
/*
 * What every libFuzzer target here shares: an assertion that says what
 * failed, where (the file names the target), with what, and aborts, so
 * that libFuzzer saves the input.
 */


#ifndef _FUZZ_H_INCLUDED_
#define _FUZZ_H_INCLUDED_


#include <stdio.h>
#include <stdlib.h>


#define fuzz_assert(cond, ...)                                                \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "assertion \"%s\" failed at %s:%d: ", #cond,      \
                    __FILE__, __LINE__);                                      \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            abort();                                                          \
        }                                                                     \
    } while (0)


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


#endif /* _FUZZ_H_INCLUDED_ */
