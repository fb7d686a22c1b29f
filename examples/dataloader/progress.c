/* Reused from the hogwild example (see data.c here). */
#include "../hogwild/progress.c"
