"""Object-store emulators started by the tests on loopback, and the environment that
points our clients at them (fsspec, tensorstore, tensorboardX, google-cloud-storage)."""

from __future__ import annotations

import contextlib
import socket

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _send_generation_headers() -> None:
    """Real GCS answers a media download with ``x-goog-generation`` (the object's version;
    tensorstore, and so orbax, needs it for its conditional writes). gcp-storage-emulator
    leaves it out, and tensorstore then fails with "Malformed StorageGeneration". This
    adds the header to the emulator's download routes; nothing else is changed.
    (The emulator also ignores ifGenerationMatch preconditions: every write succeeds,
    which a single writer never notices; :func:`_honour_generation_preconditions` makes
    the uploads and deletes that carry one check it, for the workdir lock.)"""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects
    if getattr(server, "_t5xl_generation_headers", False):
        return

    def with_generation(handler):
        def handle(request, response, storage, *args, **kwargs):
            try:
                obj = storage.get_file_obj(request.params["bucket_name"],
                                           request.params["object_id"])
                response["x-goog-generation"] = str(obj["generation"])
                response["x-goog-metageneration"] = str(obj.get("metageneration", 1))
            except Exception:
                pass
            return handler(request, response, storage, *args, **kwargs)
        return handle

    wrapped = {objects.download: with_generation(objects.download),
               objects.get: with_generation(objects.get)}  # get serves ?alt=media too
    server.HANDLERS = tuple(
        (regex, {method: wrapped.get(handler, handler) for method, handler in methods.items()})
        for regex, methods in server.HANDLERS)
    server._t5xl_generation_headers = True


def _honour_generation_preconditions() -> None:
    """Uploads and deletes with ``ifGenerationMatch`` succeed only when the object's
    generation matches (0: only when absent), answering 412 otherwise, as GCS does; the
    check and the write run under one mutex, so racing conditional writers see GCS's
    atomicity. Writes without a precondition are unchanged."""
    import threading
    from http import HTTPStatus

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects
    if getattr(server, "_t5xl_preconditions", False):
        return
    mutex = threading.Lock()

    def current_generation(storage, bucket, name) -> int:
        try:
            return int(storage.get_file_obj(bucket, name)["generation"])
        except NotFound:
            return 0

    def conditional(handler, object_name):
        def handle(request, response, storage, *args, **kwargs):
            wanted = request.query.get("ifGenerationMatch")
            if not wanted:
                return handler(request, response, storage, *args, **kwargs)
            with mutex:
                bucket = request.params["bucket_name"]
                if current_generation(storage, bucket, object_name(request)) != int(wanted[0]):
                    response.status = HTTPStatus.PRECONDITION_FAILED
                    response.json({"error": {"code": 412, "message": "Precondition Failed"}})
                    return None
                return handler(request, response, storage, *args, **kwargs)
        return handle

    def upload_name(request):
        if "name" in request.query:
            return request.query["name"][0]
        return request.data["meta"].get("name")

    wrapped = {objects.insert: conditional(objects.insert, upload_name),
               objects.delete: conditional(objects.delete,
                                           lambda request: request.params["object_id"])}
    server.HANDLERS = tuple(
        (regex, {method: wrapped.get(handler, handler) for method, handler in methods.items()})
        for regex, methods in server.HANDLERS)
    server._t5xl_preconditions = True


@contextlib.contextmanager
def gcs_emulator(bucket: str = "t5xl-test"):
    """gcp-storage-emulator in memory; yields the environment for every GCS client."""
    from gcp_storage_emulator.server import create_server
    _send_generation_headers()
    _honour_generation_preconditions()
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    host = f"http://127.0.0.1:{port}"
    try:
        yield {
            "STORAGE_EMULATOR_HOST": host,          # gcsfs, google-cloud-storage
            "TENSORSTORE_GCS_HTTP_URL": host,       # orbax's array writes
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "GOOGLE_CLOUD_PROJECT": "t5xl-test",
            "NO_GCE_CHECK": "True",                 # no metadata-server probe for credentials
            "EPATH_USE_TF": "false",
        }
    finally:
        server.stop()


@pytest.fixture(scope="module", name="gcs")
def gcs_fixture():
    """The ``gcs`` fixture (a test module imports ``gcs_fixture``): one GCS emulator for
    the module, its environment set in this process, gcsfs's cached clients dropped."""
    import gcsfs
    with gcs_emulator() as env, pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        gcsfs.GCSFileSystem.clear_instance_cache()
        yield env
    gcsfs.GCSFileSystem.clear_instance_cache()
    # train closes its TensorBoard writers; tensorboardX's bucket writer flushes again
    # when collected, at interpreter exit, when this emulator is gone, and retries for
    # 120 s each. In-process runs leave that redundant flush out (for this process).
    from tensorboardX import record_writer
    record_writer.GCSRecordWriter.__del__ = lambda self: None


@contextlib.contextmanager
def s3_emulator(bucket: str = "t5xl-test"):
    """moto's S3 server in a thread; yields the environment for boto3, s3fs, tensorstore."""
    from moto.server import ThreadedMotoServer
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,            # boto3/botocore, s3fs, tensorstore
        "AWS_ACCESS_KEY_ID": "emulator",
        "AWS_SECRET_ACCESS_KEY": "emulator",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "EPATH_USE_TF": "false",
    }
    try:
        import boto3
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="emulator",
                     aws_secret_access_key="emulator").create_bucket(Bucket=bucket)
        yield env
    finally:
        server.stop()
