/* cubevec's C API: load a diffusion model folder once, generate images or videos from it many
 * times. Plain C, so any language can bind it; link with `pkg-config --cflags --libs cubevec`.
 *
 *   char* error = NULL;
 *   cubevec_pipeline* p = cubevec_pipeline_load("assets/tinyflux", NULL, &error);
 *   cubevec_result* r = cubevec_generate(p, "{\"prompt\": \"a red circle\"}", NULL, NULL, &error);
 *   int w, h;
 *   const unsigned char* rgb = cubevec_result_rgb(r, 0, &w, &h);
 *   cubevec_result_free(r);
 *   cubevec_pipeline_free(p);
 *
 * Requests are JSON with diffusers' argument names (prompt, negative_prompt, width, height,
 * num_frames, num_inference_steps, guidance_scale, true_cfg_scale, seed, cfg, cache, sparse; see
 * docs/library.md). Load options are JSON too (dtype, variant, quant, timestep_policy, offload,
 * memory_limit, check_weights, cube_threads, vector_threads, device_profile), or NULL.
 *
 * Errors: a function that fails returns NULL (or -1) and, when `error` is not NULL, sets *error to
 * a message naming the key or file at fault, to be freed with cubevec_string_free. No C++
 * exception ever crosses this interface; errors are valid UTF-8 of at most about 4 KiB.
 *
 * Threads: a pipeline may be used by several threads at once (text encoding, and denoising with
 * offload, take turns); a result belongs to the caller. A pipeline's device threads do not survive
 * fork(): a child process must load its own. */
#ifndef CUBEVEC_H
#define CUBEVEC_H

#ifdef __cplusplus
extern "C" {
#endif

#define CUBEVEC_API_VERSION 1

typedef struct cubevec_pipeline cubevec_pipeline;
typedef struct cubevec_result cubevec_result;

/* "0.1.0 (API 1)" */
const char* cubevec_version(void);

/* Loads the model folder (a diffusers folder: transformer/, vae/, scheduler/, text encoders). */
cubevec_pipeline* cubevec_pipeline_load(const char* model_dir, const char* options_json, char** error);

/* Runs one request. `progress` (may be NULL) is called after each denoising step; a non-zero
 * return cancels the request, which then returns NULL with an error saying so, and leaves the
 * pipeline usable. */
cubevec_result* cubevec_generate(cubevec_pipeline* pipeline, const char* request_json, int (*progress)(void* user, int step, int steps),
                                 void* user, char** error);

/* Images in the result: 1 for an image, the frame count for a video; -1 for NULL. */
int cubevec_result_count(const cubevec_result* result);
/* Image `index` as RGB8, row-major, width x height x 3 bytes (valid until the result is freed);
 * NULL for a bad index or NULL result. */
const unsigned char* cubevec_result_rgb(const cubevec_result* result, int index, int* width, int* height);
/* The report as JSON: the request with its defaults, timings per stage, skipped computations,
 * memory. */
const char* cubevec_result_json(const cubevec_result* result);

void cubevec_result_free(cubevec_result* result);
void cubevec_pipeline_free(cubevec_pipeline* pipeline);
void cubevec_string_free(char* string);

#ifdef __cplusplus
}
#endif

#endif /* CUBEVEC_H */
