"""What a storage error means (not found, credentials, permission, transient), told with the URL and no secrets.

Every cloud library raises its own exceptions: s3fs turns botocore ``ClientError`` into builtin ``OSError``
subclasses with the response attached to ``__cause__``, gcsfs raises ``HttpError`` with a ``code``, adlfs raises
azure-core errors with a ``status_code``. :func:`classify` reads all of them, :func:`translate` turns them into
petastorm's storage errors, and :func:`redact` removes credentials from any text we show.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from petastorm._describe import display_url, hide_url_passwords
from petastorm.errors import (
    PetastormError,
    StorageCredentialsError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
)

Kind = Literal['not_found', 'credentials', 'permission', 'refused', 'transient', 'other']

#: storage_options keys whose values are never shown (matched as substrings of the lower-cased key).
SENSITIVE_KEY_PARTS = ('secret', 'password', 'passwd', 'token', 'credential', 'key', 'sas', 'signature',
                       'connection_string', 'auth')

_NOT_FOUND_CODES = {'NoSuchKey', 'NoSuchBucket', 'NotFound', 'NoSuchUpload', 'BlobNotFound', 'ContainerNotFound',
                    'PathNotFound', 'FilesystemNotFound', 'ResourceNotFound'}
_CREDENTIAL_CODES = {'InvalidAccessKeyId', 'SignatureDoesNotMatch', 'ExpiredToken', 'InvalidToken',
                     'TokenRefreshRequired', 'InvalidClientTokenId', 'UnrecognizedClientException', 'AuthFailure',
                     'AuthorizationHeaderMalformed', 'MissingSecurityHeader', 'InvalidSecurity',
                     'InvalidAuthenticationInfo', 'AuthenticationFailed', 'ExpiredTokenException'}
_CREDENTIAL_CLASSES = {'NoCredentialsError', 'PartialCredentialsError', 'CredentialRetrievalError',
                       'ClientAuthenticationError', 'RefreshError', 'DefaultCredentialsError', 'NoAuthTokenError',
                       'UnauthorizedSSOTokenError', 'TokenRetrievalError', 'SSOTokenLoadError'}
_CREDENTIAL_TEXT = ('Access Key Id you provided', 'signature we calculated', 'security token included',
                    'Unable to locate credentials', 'credentials', 'Unauthorized', 'Anonymous caller')
_PERMISSION_CODES = {'AccessDenied', 'AllAccessDisabled', 'AccountProblem', 'AuthorizationPermissionMismatch',
                     'AuthorizationFailure', 'InsufficientAccountPermissions', 'Forbidden', '403'}
_TRANSIENT_CODES = {'SlowDown', 'Throttling', 'ThrottlingException', 'ThrottledException', 'RequestThrottled',
                    'RequestThrottledException', 'TooManyRequestsException', 'RequestLimitExceeded',
                    'ProvisionedThroughputExceededException', 'RequestTimeout', 'RequestTimeoutException',
                    'InternalError', 'InternalFailure', 'ServiceUnavailable', 'ServerBusy', 'OperationTimedOut',
                    'PriorRequestNotComplete', 'BandwidthLimitExceeded', 'EC2ThrottledException',
                    '500', '502', '503', '504'}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
#: codes and statuses that say the storage asks for fewer requests (a subset of the transient ones).
_THROTTLING_CODES = {'SlowDown', 'Throttling', 'ThrottlingException', 'ThrottledException', 'RequestThrottled',
                     'RequestThrottledException', 'TooManyRequestsException', 'RequestLimitExceeded',
                     'ProvisionedThroughputExceededException', 'ServerBusy', 'EC2ThrottledException',
                     'ServiceUnavailable', '503', '429'}
_THROTTLING_STATUS = {429, 503}
_THROTTLING_TEXT = ('reduce your request rate', 'SlowDown', 'Too Many Requests', 'Throttl', 'SLOW_DOWN',
                    'THROTTLING', 'Service Unavailable', 'SERVICE_UNAVAILABLE', 'HTTP status 503',
                    'HTTP status 429')
_TRANSIENT_CLASSES = {'ClientPayloadError', 'ServerDisconnectedError', 'ClientConnectionError', 'ClientOSError',
                      'ServerTimeoutError', 'ClientConnectorError', 'EndpointConnectionError',
                      'ConnectionClosedError', 'ReadTimeoutError', 'ConnectTimeoutError', 'IncompleteRead',
                      'ResponseStreamingError', 'FSTimeoutError', 'ProtocolError', 'HTTPClientError',
                      'IncompleteReadError', 'RemoteDisconnected', 'ChunkedEncodingError', 'ServiceRequestError',
                      'ServiceResponseError', 'TransientStorageError', 'ShortReadError'}
_TRANSIENT_TEXT = ('reduce your request rate', 'SlowDown', 'Service Unavailable', 'ServiceUnavailable',
                   'InternalError', 'Internal Server Error', 'Bad Gateway', 'Gateway Timeout', 'Too Many Requests',
                   'Throttl', 'timed out', 'Timeout', 'Connection reset', 'Server disconnected',
                   'Connection closed', 'Connection aborted', 'Response payload is not completed', 'Broken pipe',
                   # pyarrow's own S3 client (the AWS SDK over curl): a dropped connection or a body cut short.
                   'NETWORK_CONNECTION', 'Transferred a partial file', 'Server returned nothing',
                   'Failure when receiving data', 'SLOW_DOWN', 'SERVICE_UNAVAILABLE', 'THROTTLING', 'INTERNAL_FAILURE',
                   'REQUEST_TIMEOUT')
#: what pyarrow's S3 client says when nothing listens at the endpoint (curl's "couldn't connect").
_REFUSED_TEXT = ('curlCode: 7,',)
#: an object that is no longer the version a read was made for: a failed ``If-Match``.
_CHANGED_CODES = {'PreconditionFailed', '412'}


class ShortReadError(OSError):
    """A ranged read returned fewer bytes than asked (a connection dropped mid-body); it is retried."""


def secrets_of(options: Any) -> list[str]:
    """Every string value under a sensitive key of ``options`` (nested dicts and lists included), longest first."""
    found: set[str] = set()

    def walk(value: Any, sensitive: bool) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                lowered = str(key).lower()
                walk(item, sensitive or any(part in lowered for part in SENSITIVE_KEY_PARTS))
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item, sensitive)
        elif sensitive and isinstance(value, (str, bytes)):
            text = value.decode('utf-8', 'replace') if isinstance(value, bytes) else value
            if len(text) >= 4:
                found.add(text)

    walk(options, False)
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each secret and every password in a URL's user-info replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, '***')
    return hide_url_passwords(text)


def safe_cause(err: BaseException, secrets: Iterable[str]) -> BaseException | None:
    """``err``, to chain as the cause of the error we raise, or None when its text would show a secret."""
    secrets = [s for s in secrets if s]
    for item in _chain(err):
        text = f'{item!s} {item!r}'
        if any(secret in text for secret in secrets):
            return None
    return err


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


#: how pyarrow's own S3 client (the AWS SDK for C++) names an error in its message: ``AWS Error NO_SUCH_KEY``.
_AWS_SDK_ERROR = re.compile(r'AWS Error ([A-Z][A-Z0-9_]+)')
_HTTP_STATUS = re.compile(r'HTTP status (\d{3})')
#: pyarrow's S3 client asked to write into a bucket that does not exist (it creates none).
_MISSING_BUCKET = re.compile(r"Bucket '[^']*' not found")


def _codes(err: BaseException) -> tuple[set[str], set[int]]:
    codes: set[str] = set()
    statuses: set[int] = set()
    if isinstance(err, OSError) and not isinstance(err, PetastormError):
        text = str(err)
        # NO_SUCH_KEY is the service's NoSuchKey: read it as the code botocore would give.
        codes.update(''.join(part.capitalize() for part in name.split('_')) for name in _AWS_SDK_ERROR.findall(text))
        statuses.update(int(status) for status in _HTTP_STATUS.findall(text))
    response = getattr(err, 'response', None)
    if isinstance(response, Mapping):
        error = response.get('Error') or {}
        if error.get('Code'):
            codes.add(str(error['Code']))
        status = (response.get('ResponseMetadata') or {}).get('HTTPStatusCode')
        if isinstance(status, int):
            statuses.add(status)
    for attribute in ('code', 'status', 'status_code', 'error_code'):
        value = getattr(err, attribute, None)
        if isinstance(value, int) and 100 <= value < 600:
            statuses.add(value)
        elif isinstance(value, str) and value:
            codes.add(value)
    return codes, statuses


def classify(err: BaseException) -> Kind:
    """What a storage exception means, from its type, error code, HTTP status and text (whole chain read)."""
    chain = list(_chain(err))
    codes: set[str] = set()
    statuses: set[int] = set()
    for item in chain:
        more_codes, more_statuses = _codes(item)
        codes |= more_codes
        statuses |= more_statuses
    names = {type(item).__name__ for item in chain}
    text = ' '.join(str(item) for item in chain)
    if isinstance(err, FileNotFoundError) or codes & _NOT_FOUND_CODES or 404 in statuses or \
            _MISSING_BUCKET.search(text):
        return 'not_found'
    if (codes & _CREDENTIAL_CODES or names & _CREDENTIAL_CLASSES or 401 in statuses
            or (isinstance(err, PermissionError) and any(marker in text for marker in _CREDENTIAL_TEXT))):
        return 'credentials'
    if isinstance(err, PermissionError) or codes & _PERMISSION_CODES or 403 in statuses:
        return 'permission'
    if is_refused(err):
        return 'refused'
    if is_transient(err):
        return 'transient'
    return 'other'


def is_refused(err: BaseException) -> bool:
    """True when the endpoint refused the connection: nothing listens there, and retrying will not change it."""
    return any(isinstance(item, ConnectionRefusedError) or any(marker in str(item) for marker in _REFUSED_TEXT)
               for item in _chain(err))


def is_changed(err: BaseException) -> bool:
    """True when the storage refused a read because the object's ETag is no longer the one asked for."""
    for item in _chain(err):
        codes, statuses = _codes(item)
        if codes & _CHANGED_CODES or 412 in statuses or type(item).__name__ == 'FileExpired':
            return True
    return False


def is_transient(err: BaseException) -> bool:
    """True for errors worth retrying: timeouts, dropped connections, throttling and 5xx answers.

    A refused connection is not one: the address is wrong or the server is down, so it is reported at once.
    """
    if isinstance(err, (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError,
                        NotADirectoryError, PetastormError)) or is_refused(err) or is_changed(err):
        return False
    for item in _chain(err):
        if isinstance(item, (TimeoutError, ConnectionError, ShortReadError)):
            return True
        if type(item).__name__ in _TRANSIENT_CLASSES:
            return True
        codes, statuses = _codes(item)
        if codes & _TRANSIENT_CODES or statuses & _TRANSIENT_STATUS:
            return True
    text = str(err)
    return any(marker in text for marker in _TRANSIENT_TEXT)


def is_throttling(err: BaseException) -> bool:
    """True when the storage asked for fewer requests: a 503 ``SlowDown``, a 429, a throttling error code.

    Such an error is transient, and the right answer to it is to wait longer and send fewer requests at once
    (:mod:`petastorm.fs._throttle`), not to give up after the few retries a dropped connection gets.
    """
    if not is_transient(err):
        return False
    for item in _chain(err):
        codes, statuses = _codes(item)
        if codes & _THROTTLING_CODES or statuses & _THROTTLING_STATUS:
            return True
    text = ' '.join(str(item) for item in _chain(err))
    return any(marker in text for marker in _THROTTLING_TEXT)


def is_ambiguous_refusal(err: BaseException) -> bool:
    """A bare HTTP 403 (an answer to HEAD has no body): bad credentials and missing permission look alike."""
    if classify(err) != 'permission':
        return False
    codes: set[str] = set()
    for item in _chain(err):
        codes |= _codes(item)[0]
    return codes <= {'403', 'Forbidden'}


def describe(err: BaseException, secrets: Iterable[str] = ()) -> str:
    """``Type: message`` of an exception (plus the error code of its cause when the message lacks it), redacted."""
    text = f'{type(err).__name__}: {err}'
    for item in _chain(err):
        codes, _ = _codes(item)
        missing = sorted(code for code in codes if code not in text)
        if missing:
            text += f' [{", ".join(missing)}]'
            break
    return redact(text, secrets)


def _no_credentials(err: BaseException) -> bool:
    """The client found no credentials at all (botocore's ``NoCredentialsError``), rather than having some refused."""
    return any(type(item).__name__ == 'NoCredentialsError' or 'Unable to locate credentials' in str(item)
               for item in _chain(err))


_PREPOSITIONS = frozenset({'of', 'at', 'to', 'on', 'in', 'from', 'into'})


def operation_on(operation: str, shown: str) -> str:
    """``'listing on s3://b/d'``, ``'reading row group 3 of s3://b/f'``: an operation (ending with its preposition
    or not) and the URL it acted on, as one phrase."""
    words = operation.split()
    return f'{operation} {shown}' if words and words[-1] in _PREPOSITIONS else f'{operation} on {shown}'


def _bare(operation: str) -> str:
    """The operation without a trailing preposition (``'opening the dataset at'`` -> ``'opening the dataset'``)."""
    words = operation.split()
    return ' '.join(words[:-1]) if len(words) > 1 and words[-1] in _PREPOSITIONS else operation


def translate(err: BaseException, operation: str, url: str, secrets: Iterable[str] = (),
              attempts: int = 1) -> BaseException:
    """The petastorm error to raise (chained ``from err``) for ``err`` raised by ``operation`` on ``url``.

    Petastorm's own errors and the ``OSError`` kinds that callers branch on (exists, is/not a directory) are
    returned unchanged.
    """
    if isinstance(err, (PetastormError, FileExistsError, IsADirectoryError, NotADirectoryError)):
        return err
    if not isinstance(err, Exception):
        return err
    secrets = list(secrets)
    shown = display_url(url)
    acted, bare = operation_on(operation, shown), _bare(operation)
    detail = describe(err, secrets)
    kind = classify(err)
    if kind == 'not_found':
        return StorageNotFoundError(f'{shown} does not exist ({bare}: {detail})')
    if kind == 'credentials' and _no_credentials(err):
        return StorageCredentialsError(
            f'no credentials were found for {shown} ({bare}: {detail}). Pass them in storage_options (for S3: '
            f"key/secret/token or profile, or {{'anon': True}} for a public bucket) or set them in the environment.")
    if kind == 'credentials':
        return StorageCredentialsError(
            f'the storage refused the credentials used for {shown} ({bare}: {detail}). Check the '
            f'credentials passed in storage_options (for S3: key/secret/token or profile) or found in the '
            f'environment, and that they have not expired.')
    if kind == 'permission':
        return StoragePermissionError(
            f'permission denied: {acted} ({detail}). The credentials in use (from storage_options '
            f'or the environment) were refused or are not allowed to do this.')
    if kind == 'refused':
        return StorageError(f'{acted} failed: the storage endpoint refused the connection ({detail}). '
                            f'Nothing listens at that address: check the endpoint (for S3, endpoint_url in '
                            f'storage_options) and that the server is running.')
    if kind == 'transient' and attempts > 1:
        return StorageError(f'{acted} still failed after {attempts} attempts with transient errors '
                            f'({detail}); the storage is unreachable, overloaded or throttling. Try again later.')
    return StorageError(f'{acted} failed: {detail}')
