/* The smallest program that embeds cubevec: renders a prompt through the C API (include/cubevec.h)
 * and writes the picture as a binary PPM (a video's first frame).
 *
 *   cc examples/embed.c $(pkg-config --cflags --libs cubevec) -o embed
 *   ./embed assets/tinyflux out.ppm "a large red circle in the center on a blue background"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubevec.h>

static int on_step(void* user, int step, int steps) {
  (void)user;
  fprintf(stderr, "\rstep %d/%d", step, steps);
  if (step == steps) fprintf(stderr, "\n");
  return 0; /* non-zero would cancel */
}

/* {"prompt": "<text>"} with the text's quotes, backslashes and control characters escaped. */
static char* request_for(const char* prompt) {
  char* json = malloc(strlen(prompt) * 6 + 16);
  char* out = json;
  if (!json) return NULL;
  out += sprintf(out, "{\"prompt\": \"");
  for (const unsigned char* c = (const unsigned char*)prompt; *c; ++c) {
    if (*c == '"' || *c == '\\') out += sprintf(out, "\\%c", *c);
    else if (*c < 0x20) out += sprintf(out, "\\u%04x", *c);
    else *out++ = (char)*c;
  }
  sprintf(out, "\"}");
  return json;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s MODEL_DIR OUT.ppm [PROMPT]\n", argv[0]);
    return 2;
  }
  const char* prompt = argc == 4 ? argv[3] : "a large red circle in the center on a blue background";
  char* error = NULL;
  cubevec_pipeline* pipeline = cubevec_pipeline_load(argv[1], NULL, &error);
  if (!pipeline) {
    fprintf(stderr, "embed: %s\n", error);
    cubevec_string_free(error);
    return 1;
  }
  char* request = request_for(prompt);
  cubevec_result* result = request ? cubevec_generate(pipeline, request, on_step, NULL, &error) : NULL;
  free(request);
  if (!result) {
    fprintf(stderr, "embed: %s\n", error ? error : "out of memory");
    cubevec_string_free(error);
    cubevec_pipeline_free(pipeline);
    return 1;
  }
  int width = 0, height = 0;
  const unsigned char* rgb = cubevec_result_rgb(result, 0, &width, &height);
  FILE* out = fopen(argv[2], "wb");
  int status = 0;
  if (!rgb || !out || fprintf(out, "P6\n%d %d\n255\n", width, height) < 0 ||
      fwrite(rgb, 3, (size_t)width * (size_t)height, out) != (size_t)width * (size_t)height) {
    fprintf(stderr, "embed: cannot write %s\n", argv[2]);
    status = 1;
  }
  if (out && fclose(out) != 0) status = 1;
  if (status == 0) fprintf(stderr, "embed: wrote %s (%dx%d)\n", argv[2], width, height);
  cubevec_result_free(result);
  cubevec_pipeline_free(pipeline);
  return status;
}
